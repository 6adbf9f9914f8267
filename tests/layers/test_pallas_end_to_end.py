"""The engine on each Pallas kernel (interpret mode on CPU) produces `native`'s greedy tokens.

The embedded gpt-oss (sliding window 32 on half the layers, sinks, MoE) with its EAGLE-3 head drafting
trees (top-2 branches, 4 draft tokens): prefill chunks, radix-cache hits (the prompts share a prefix),
tree verification under the custom mask and the draft head's own attention all run on the kernel.
Page size 16; the prompts cross the window and several 64-token chunks.
"""

import pytest

from jaxserve.api import Engine
from jaxserve.assets import EMBEDDED_DRAFT_DIR, EMBEDDED_MODEL_DIR
from tests.engine.conftest import prompts, small_buckets

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

GREEDY = {"temperature": 0.0, "max_new_tokens": 6, "ignore_eos": True}
TREE = dict(speculative_algorithm="EAGLE3", speculative_draft_model_path=str(EMBEDDED_DRAFT_DIR),
            speculative_num_steps=2, speculative_eagle_topk=2, speculative_num_draft_tokens=4)


def _outputs(backend: str) -> list[list[int]]:
    engine = Engine(model_path=str(EMBEDDED_MODEL_DIR), page_size=16, max_total_tokens=1024,
                    chunked_prefill_size=64, max_running_requests=4, attention_backend=backend,
                    buckets=small_buckets(max_tokens=64, max_seqs=4, max_pages=64), **TREE)
    assert engine.model.layers[0].attn.cfg.backend == backend
    shared = prompts(5, [40])[0]
    first, *rest = [shared + p for p in prompts(6, [7, 50])] + prompts(7, [33])
    outs = []
    for batch in ([first], rest):  # the second batch's first prompt hits the first one's cached prefix
        outs += [o["output_ids"] for o in engine.generate(input_ids=batch, sampling_params=GREEDY)]
    return outs


@pytest.fixture(scope="module")
def native_outputs() -> list[list[int]]:
    return _outputs("native")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["pallas_gpu", "pallas_tpu"])
def test_engine_greedy_tokens_equal_native_with_eagle_trees(backend, native_outputs):
    got = _outputs(backend)
    assert got == native_outputs
    assert all(len(o) == GREEDY["max_new_tokens"] for o in got)
