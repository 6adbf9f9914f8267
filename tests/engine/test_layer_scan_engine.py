"""The engine scans its layers by default (`scan_layers`); greedy outputs equal the unrolled layer loop's
(`disable_layer_scan=True`) on tiny Llama, Qwen3 and gpt-oss (hybrid SWA pools, sinks, MoE), with chunked
prefill, paged KV and the radix cache on (the second pass hits the prefixes the first one cached)."""

import pytest

from jaxserve.models.build import random_model
from jaxserve.models.config import ModelConfig
from jaxserve.models.layer_stack import LayerStack
from tests.engine.conftest import GPT_OSS, assert_no_leak, make_engine, prompts
from tests.models.helpers import TINY

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

GREEDY = {"temperature": 0.0, "max_new_tokens": 10, "ignore_eos": True}
GPT_OSS_5 = dict(GPT_OSS, num_hidden_layers=5,
                 layer_types=["sliding_attention", "full_attention"] * 2 + ["sliding_attention"])
QWEN3 = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=256, hidden_size=64,
             intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=512)


def _outputs(model, **kwargs) -> tuple[list[list[int]], object]:
    engine = make_engine(model, page_size=4, chunked_prefill_size=32, **kwargs)
    batch = prompts(3, [5, 40, 17, 23])
    outs = [[o["output_ids"] for o in engine.generate(input_ids=batch, sampling_params=GREEDY)]
            for _ in range(2)]
    assert outs[0] == outs[1]
    assert_no_leak(engine)
    return outs[0], engine


@pytest.mark.parametrize("name", ["llama", "qwen3", "gpt_oss"])
def test_scanned_engine_matches_unrolled(name, request):
    if name == "llama":
        model = request.getfixturevalue(name)[1]
    else:  # gpt-oss: two (sliding, full) blocks scanned, the fifth layer unrolled after them
        raw = QWEN3 if name == "qwen3" else dict(TINY, architectures=["GptOssForCausalLM"],
                                                  model_type="gpt_oss", **GPT_OSS_5)
        model = random_model(ModelConfig.from_dict(raw), seed=3)
    scanned, engine = _outputs(model)
    assert isinstance(engine.model.layers, LayerStack)
    unrolled, engine = _outputs(model, disable_layer_scan=True)
    assert not isinstance(engine.model.layers, LayerStack)
    assert scanned == unrolled
