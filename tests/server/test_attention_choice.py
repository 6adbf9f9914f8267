"""`--attention-backend`: every SGLang name maps onto a registered backend of ours, per platform; names that
cannot run here fall back with a warning; our own names pass through; typos are errors."""

from __future__ import annotations

import pytest

from jaxserve.server.attention_choice import (
    SGLANG_BACKENDS,
    best_backend,
    known_backend_names,
    resolve_attention_backend,
)

CPU_ONLY = ["native", "xla"]
WITH_KERNELS = ["native", "pallas_gpu", "pallas_tpu", "xla"]


@pytest.mark.parametrize("platform", ["cpu", "gpu", "tpu"])
@pytest.mark.parametrize("registered", [["native"], CPU_ONLY, WITH_KERNELS])
@pytest.mark.parametrize("name", sorted(SGLANG_BACKENDS))
def test_every_sglang_name_resolves_to_a_registered_backend(name, registered, platform):
    choice = resolve_attention_backend(name, platform, registered)
    assert choice.backend in registered
    assert choice.backend in choice.message and choice.platform == platform
    where = SGLANG_BACKENDS[name][0]
    assert choice.fallback == (where is not None and where != platform)
    if name == "torch_native":
        assert choice.backend == "native"
    else:
        assert choice.backend == best_backend(platform, registered)


def test_gpu_kernel_names_pick_the_gpu_kernel_on_a_gpu_and_warn_on_a_cpu():
    on_gpu = resolve_attention_backend("triton", "gpu", WITH_KERNELS)
    assert (on_gpu.backend, on_gpu.fallback) == ("pallas_gpu", False)
    on_cpu = resolve_attention_backend("fa3", "cpu", WITH_KERNELS)
    assert (on_cpu.backend, on_cpu.fallback) == ("xla", True) and "cannot run on cpu" in on_cpu.message
    assert resolve_attention_backend("fa", "tpu", WITH_KERNELS).backend == "pallas_tpu"


def test_our_names_pass_through_where_they_run():
    assert resolve_attention_backend("native", "gpu", WITH_KERNELS).backend == "native"
    assert resolve_attention_backend("XLA", "cpu", CPU_ONLY).backend == "xla"
    tpu_on_gpu = resolve_attention_backend("pallas_tpu", "gpu", WITH_KERNELS)
    assert (tpu_on_gpu.backend, tpu_on_gpu.fallback) == ("pallas_gpu", True)
    assert "tpu only" in tpu_on_gpu.message
    missing = resolve_attention_backend("pallas_gpu", "gpu", CPU_ONLY)
    assert (missing.backend, missing.fallback) == ("xla", True)
    assert resolve_attention_backend("fa3", "cpu", ["xla"]).backend == "xla"  # the next registered one


def test_an_unknown_name_is_an_error_listing_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown name.*triton"):
        resolve_attention_backend("trition", "cpu", CPU_ONLY)
    assert {"triton", "fa3", "flashinfer", "torch_native", "native"} <= set(known_backend_names())
