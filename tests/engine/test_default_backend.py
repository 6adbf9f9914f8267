"""The engine's default attention backend is `auto`: the Pallas kernel of a TPU or GPU, `xla` on a CPU,
and greedy outputs of the embedded model are the
same under `xla` and `native` (both in this run: long prompts past the sliding window, chunked prefill,
batched decodes)."""

import pytest

from jaxserve.api import Engine
from jaxserve.assets import EMBEDDED_MODEL_DIR
from jaxserve.engine.config import ServerArgs
from jaxserve.layers.backends import (
    DEFAULT_BACKEND,
    get_backend,
    platform_default,
    resolve_backend_name,
    xla,
)
from tests.engine.conftest import prompts

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

GREEDY = {"temperature": 0.0, "max_new_tokens": 12, "ignore_eos": True}


def test_the_default_backend_and_unknown_names_fail():
    assert DEFAULT_BACKEND == "auto"
    assert ServerArgs().attention_backend == "auto"
    assert [platform_default(p) for p in ("tpu", "gpu", "cpu", "npu")] == [
        "pallas_tpu", "pallas_gpu", "xla", "xla"]
    assert resolve_backend_name("xla", "tpu") == "xla"  # a named backend is never replaced
    assert get_backend("auto") is xla.ragged_paged_attention  # this process runs on a CPU
    with pytest.raises(ValueError, match=r"unknown attention backend 'flashinfer'.*native.*xla"):
        ServerArgs(attention_backend="flashinfer")


def _engine(backend: str | None) -> Engine:
    kwargs = {} if backend is None else {"attention_backend": backend}
    return Engine(model_path=str(EMBEDDED_MODEL_DIR), max_total_tokens=1024, chunked_prefill_size=64,
                  max_running_requests=4, **kwargs)


@pytest.mark.slow
def test_embedded_greedy_outputs_are_the_same_under_xla_and_native():
    batch = prompts(5, [7, 90, 33, 150])  # the window is 32; 90 and 150 span several 64-token chunks
    engines = {name: _engine(name) for name in (None, "native")}
    assert resolve_backend_name(engines[None].model.layers[0].attn.cfg.backend) == "xla"
    assert engines["native"].model.layers[0].attn.cfg.backend == "native"
    outs = {name: [o["output_ids"] for o in e.generate(input_ids=batch, sampling_params=GREEDY)]
            for name, e in engines.items()}
    assert outs[None] == outs["native"]
    assert all(len(o) == 12 for o in outs[None])
