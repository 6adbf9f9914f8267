"""`program_cache`: cached program factories release their executables (and, on CPU, the machine code's
memory mappings, counted in /proc/self/maps), and a compile that would leave the process short of mappings
is refused with an error naming the limit; once mappings are free again, the same program compiles."""

from __future__ import annotations

import gc
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.engine import program_cache, runner
from jaxserve.engine.program_cache import (
    MappingLimitError,
    check_mapping_headroom,
    memory_mappings,
    program_factory,
    release_unused_programs,
)

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts /proc/self/maps")


def _no_repad(args, bucket):
    raise AssertionError("no fallback expected")


@program_factory(maxsize=8)
def _factory(scale: int) -> runner.Programs:
    @jax.jit
    def fn(x):
        for _ in range(4):  # a few kernels, so the executable has several object files
            x = jnp.tanh(x * scale) + jnp.sin(x)
        return jnp.sort(x) * scale

    return runner.Programs(fn, f"toy{scale}")


def _run(scale: int, x: np.ndarray) -> np.ndarray:
    return np.asarray(_factory(scale).call(x.shape, (x,), _no_repad))


def _reference(scale: int, x: np.ndarray) -> np.ndarray:
    for _ in range(4):
        x = np.tanh(x * scale) + np.sin(x)
    return np.sort(x) * scale


def _mappings() -> int:
    counts = memory_mappings()
    assert counts is not None
    return counts[0]


def _baseline(x: np.ndarray) -> int:
    """Mappings once one program of this shape has been compiled and released (a process's first compiles
    also map what stays: the compiler's own state, thread stacks, allocator arenas)."""
    _run(100, x)
    release_unused_programs()
    return _mappings()


@linux_only
def test_releasing_drops_cached_programs_and_their_mappings() -> None:
    x = np.linspace(-1, 1, 16, dtype=np.float32)
    before = _baseline(x)
    for scale in range(1, 7):
        np.testing.assert_allclose(_run(scale, x), _reference(scale, x), rtol=1e-5, atol=1e-5)
    held = _mappings()
    assert held - before >= 6 * 3  # each executable maps at least one object file (code, rodata, data)
    cached = id(_factory(1))
    assert id(_factory(1)) == cached  # cached until released
    release_unused_programs()
    assert held - _mappings() >= 0.8 * (held - before)  # nearly all of it is given back
    np.testing.assert_allclose(_run(1, x), _reference(1, x), rtol=1e-5, atol=1e-5)  # and compiles again


@linux_only
def test_an_executable_still_held_keeps_its_mappings() -> None:
    x = np.linspace(-1, 1, 8, dtype=np.float32)
    before = _baseline(x)
    kept = _factory(3)
    np.testing.assert_allclose(np.asarray(kept.call(x.shape, (x,), _no_repad)), _reference(3, x), rtol=1e-5,
                               atol=1e-5)
    held = _mappings()
    release_unused_programs()
    assert _mappings() - before >= 0.8 * (held - before)
    np.testing.assert_allclose(np.asarray(kept.call(x.shape, (x,), _no_repad)), _reference(3, x), rtol=1e-5,
                               atol=1e-5)
    assert kept.num_compiles == 1
    del kept
    gc.collect()
    assert held - _mappings() >= 0.8 * (held - before)


@linux_only
def test_headroom_check_counts_against_the_kernel_limit() -> None:
    used, limit = memory_mappings()
    with open("/proc/sys/vm/max_map_count") as f:
        assert limit == int(f.read())
    with open("/proc/self/maps") as f:
        assert abs(sum(1 for _ in f) - used) < 64  # the same count, give or take this test's allocations
    check_mapping_headroom(0)
    with pytest.raises(MappingLimitError, match=r"vm\.max_map_count"):
        check_mapping_headroom(limit - used + 1000)


@linux_only
def test_a_compile_short_of_mappings_fails_clearly_then_succeeds_once_there_is_room(monkeypatch) -> None:
    x = np.linspace(-1, 1, 12, dtype=np.float32)
    release_unused_programs()
    programs = _factory(5)
    _, limit = memory_mappings()
    monkeypatch.setattr(program_cache, "MIN_FREE_MAPPINGS", limit)  # more than any process has left
    with pytest.raises(MappingLimitError, match="release_unused_programs"):
        programs.call(x.shape, (x,), _no_repad)
    monkeypatch.setattr(program_cache, "MIN_FREE_MAPPINGS", 0)  # the failure is not kept: a call retries
    np.testing.assert_allclose(np.asarray(programs.call(x.shape, (x,), _no_repad)), _reference(5, x),
                               rtol=1e-5, atol=1e-5)
    assert programs.num_compiles == 1


@linux_only
@pytest.mark.slow
def test_an_eagle_engine_gives_back_its_programs_mappings_once_released() -> None:
    """Every factory of the plain and EAGLE-3 step programs is registered: after the engine is dropped, a
    release gives back nearly all the mappings its programs took (about 700 per round program on CPU)."""
    from jaxserve.api import Engine
    from jaxserve.assets import EMBEDDED_MODEL_DIR

    release_unused_programs()
    gc.collect()
    before = _mappings()
    engine = Engine(model_path=str(EMBEDDED_MODEL_DIR), speculative_algorithm="EAGLE3",
                    speculative_draft_model_path=str(EMBEDDED_MODEL_DIR / "draft"), speculative_num_steps=2,
                    max_total_tokens=2048, max_running_requests=4, speculative_policy="always")
    out = engine.generate(["You are a helpful", "hello"], {"temperature": 0, "max_new_tokens": 6})
    assert all(o["meta_info"]["completion_tokens"] == 6 for o in out)
    held = _mappings()
    assert held - before > 1000
    del engine, out
    gc.collect()
    assert held - _mappings() < 0.2 * (held - before)  # the factories' caches still hold the programs
    release_unused_programs()
    assert held - _mappings() >= 0.8 * (held - before)


def test_a_refused_background_compile_leaves_steps_running_padded_without_requeueing(monkeypatch) -> None:
    """With background compiles on, a step whose exact program is refused (no mappings left) runs padded to
    a compiled larger bucket, every time, without queueing its program again at each call; a call with
    nothing to fall back on tries the refused program again and succeeds once there is room."""

    @jax.jit
    def fn(x):
        return jnp.tanh(x) * 2.0 + 1.0

    def repad(args, bucket):
        (x,) = args
        return (np.pad(x, (0, bucket[0] - x.shape[0])),)

    programs = runner.Programs(fn, "toy_padded")
    big, small = np.linspace(-1, 1, 32, dtype=np.float32), np.linspace(-2, 2, 8, dtype=np.float32)
    np.testing.assert_allclose(np.asarray(programs.call((32,), (big,), repad)), np.tanh(big) * 2 + 1,
                               rtol=1e-5, atol=1e-6)
    runner.enable_background_compiles()
    try:
        monkeypatch.setattr(program_cache, "MIN_FREE_MAPPINGS", 1 << 40)  # every compile is refused
        for _ in range(3):
            out = np.asarray(programs.call((8,), (small,), repad))
            np.testing.assert_allclose(out[:8], np.tanh(small) * 2 + 1, rtol=1e-5, atol=1e-6)
            assert programs.prepare((8,), (small,)).wait(60.0)  # its (one) background compile has ended
        assert programs.num_padded == 3
        assert programs.num_compiles == 2  # the small program was queued once, not at every call
        runner.enable_background_compiles(False)
        with pytest.raises(MappingLimitError):  # no fallback now: compiled on this thread, refused again
            programs.call((8,), (small,), repad)
        monkeypatch.setattr(program_cache, "MIN_FREE_MAPPINGS", 0)
        np.testing.assert_allclose(np.asarray(programs.call((8,), (small,), repad)), np.tanh(small) * 2 + 1,
                                   rtol=1e-5, atol=1e-6)
        assert programs.num_compiles == 2
    finally:
        runner.enable_background_compiles(False)
