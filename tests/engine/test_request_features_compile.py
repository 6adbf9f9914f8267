"""logit_bias and (top) logprobs are data: a randomized run mixing them compiles the step at most once per
bucket shape, and a logit_bias of +100 makes greedy decoding emit the biased token."""

import numpy as np
import pytest

from jaxserve.api import Engine
from jaxserve.engine.step_input import Buckets
from jaxserve.models.build import random_model
from jaxserve.models.config import ModelConfig

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

CONFIG = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=336, hidden_size=64,
              intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=256)


def test_request_features_compile_nothing_per_request():
    model = random_model(ModelConfig.from_dict(CONFIG), seed=4)  # its own vocab: nothing compiled before
    buckets = Buckets(tokens=(8, 32), seqs=(2, 8), pages=(16, 64))
    engine = Engine(model=model, page_size=4, max_total_tokens=512, chunked_prefill_size=32,
                    max_running_requests=8, buckets=buckets)
    rng = np.random.RandomState(1)
    rids = []
    for i in range(60):
        params = {"max_new_tokens": int(rng.randint(1, 10)), "ignore_eos": True,
                  "temperature": float(rng.choice([0.0, 0.8])), "return_logprob": bool(rng.rand() < 0.5),
                  "top_logprobs_num": int(rng.choice([0, 1, 5, 20]))}
        if rng.rand() < 0.5:
            params["logit_bias"] = {str(t): float(rng.uniform(-5, 5)) for t in rng.randint(0, 336, 10)}
        rids.append(engine.submit(input_ids=rng.randint(0, 336, size=rng.randint(1, 40)).tolist(),
                                  sampling_params=params))
        if i % 3 == 0:
            engine.step()
    engine.run_until_idle()
    assert 1 <= engine.runner.num_compiles <= buckets.num_shapes
    for rid in rids:
        req = engine.request(rid)
        assert len(req.top_logprobs) == (len(req.output_ids) if req.params.top_logprobs_num else 0)
        for ids, lps in req.top_logprobs:
            assert len(ids) == req.params.top_logprobs_num and lps == sorted(lps, reverse=True)
    out = engine.generate(input_ids=[1, 2, 3], sampling_params={
        "temperature": 0, "max_new_tokens": 4, "ignore_eos": True, "logit_bias": {"77": 100}})
    assert out["output_ids"] == [77] * 4
