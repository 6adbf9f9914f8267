"""The step compiles at most once per bucket shape, whatever the traffic: a randomized 200-request run."""

import numpy as np
import pytest

from jaxserve.api import Engine
from jaxserve.engine.step_input import Buckets
from jaxserve.models.build import random_model
from jaxserve.models.config import ModelConfig

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

CONFIG = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=320, hidden_size=64,
              intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=256)


def test_randomized_run_stays_within_the_bucket_count():
    # a model of its own (vocab 320): its jitted step has compiled nothing before this test
    model = random_model(ModelConfig.from_dict(CONFIG), seed=3)
    buckets = Buckets(tokens=(8, 32), seqs=(2, 8), pages=(16, 64))
    engine = Engine(model=model, page_size=4, max_total_tokens=512, chunked_prefill_size=32,
                    max_running_requests=8, buckets=buckets)
    assert engine.runner.num_compiles == 0
    rng = np.random.RandomState(0)
    prefixes = [rng.randint(0, 320, size=n).tolist() for n in (10, 40)]
    submitted = 0
    while submitted < 200 or not engine.idle:
        for _ in range(rng.poisson(1.0) if submitted < 200 else 0):
            prompt = rng.randint(0, 320, size=rng.randint(1, 60)).tolist()
            if rng.rand() < 0.5:
                prompt = prefixes[rng.randint(2)] + prompt
            params = {"max_new_tokens": int(rng.randint(1, 20)), "ignore_eos": True,
                      "temperature": float(rng.choice([0.0, 0.8])), "top_k": int(rng.choice([-1, 20])),
                      "repetition_penalty": float(rng.choice([1.0, 1.2]))}
            engine.submit(input_ids=prompt[:200], sampling_params=params)
            submitted += 1
        engine.step()
        if engine.stats["steps"] % 50 == 0:
            engine.check_memory()
    assert submitted == 200
    assert 1 <= engine.runner.num_compiles <= buckets.num_shapes == 8
    assert all(r.finished for r in engine._requests.values())
    engine.flush_cache()
    assert engine.kv.allocator.available_size() == engine.kv.num_slots


def test_warmup_compiles_every_bucket_shape_once():
    model = random_model(ModelConfig.from_dict({**CONFIG, "vocab_size": 300}), seed=4)
    buckets = Buckets(tokens=(8, 16), seqs=(2,), pages=(64,))
    engine = Engine(model=model, max_total_tokens=64, chunked_prefill_size=16, max_running_requests=2,
                    buckets=buckets, warmup=True)
    assert engine.runner.num_compiles == buckets.num_shapes == 2
    assert engine.kv.allocator.available_size() == engine.kv.num_slots  # warm-up touched only slot 0
    engine.generate(input_ids=[[1, 2, 3], list(range(14))], sampling_params={"max_new_tokens": 5})
    assert engine.runner.num_compiles == 2
