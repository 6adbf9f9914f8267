"""Test-wide settings.

- JAX's persistent compilation cache lives in the clone (git-ignored .jax_cache/).
- After each test module, the step programs no live engine holds are released
  (`program_cache.release_unused_programs`), and JAX's own caches too once the worker holds over a quarter
  of its memory mappings: on CPU each compiled program keeps hundreds of mappings, and a worker that kept
  every module's programs reached the kernel's limit (vm.max_map_count, 65530) and crashed with a
  segmentation fault inside XLA. (Clean runs, most mappings in a worker before / after a release: 41k / 22k
  with releases alone, 30k / 17k with the conditional clear.)
- XLA's optimisation passes are off (`JAX_DISABLE_MOST_OPTIMIZATIONS`, inherited by the servers and
  children the tests start): the suite compiles some four thousand programs for tiny models, and at these
  sizes the passes cost far more compile time than they save at run time (one run of the spec-tree and
  layer-scan tests: 278 s with them, 185 s without). What the tests assert does not depend on them: greedy
  equality and parity tolerances hold either way. Tests that assert on the compiled HLO itself (donated
  pools updated in place, no pool copy) are marked `xla_optimized` and compile as production does.
"""

import gc
import os
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(_ROOT / ".jax_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(autouse=True, scope="module")
def _release_programs_after_each_module():
    """Set up first in every module, so torn down after the module's own fixtures (and their engines)."""
    yield
    import jax

    from jaxserve.engine.program_cache import memory_mappings, release_unused_programs

    release_unused_programs()
    counts = memory_mappings()
    if counts is not None and counts[0] > counts[1] // 4:  # the rest: functions jitted outside the factories
        jax.clear_caches()
        gc.collect()


@pytest.fixture(autouse=True)
def _production_xla_for_hlo_checks(request):
    """Under `@pytest.mark.xla_optimized`, compile with XLA's full optimisation, as a server does."""
    if request.node.get_closest_marker("xla_optimized") is None:
        yield
        return
    import jax

    before = jax.config.values["jax_disable_most_optimizations"]
    jax.config.update("jax_disable_most_optimizations", False)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", before)


_REPORT = os.environ.get("JAXSERVE_COMPILE_REPORT")  # a path prefix: one JSON-lines file per xdist worker
if _REPORT:
    import json
    import time

    _totals: dict[str, float] = {}

    def _on_duration(event: str, seconds: float, **_: object) -> None:
        if event.startswith("/jax/core/compile/"):
            name = event.rsplit("/", 1)[-1]
            _totals[name] = _totals.get(name, 0.0) + seconds
            _totals[name + "_count"] = _totals.get(name + "_count", 0.0) + 1

    def _on_event(event: str, **_: object) -> None:
        if event == "/jax/compilation_cache/cache_hits":
            _totals["cache_hits"] = _totals.get("cache_hits", 0.0) + 1

    @pytest.fixture(autouse=True)
    def _compile_report(request):
        """Opt-in (`JAXSERVE_COMPILE_REPORT=/tmp/prefix`): per test, wall and this process's CPU seconds (the
        latter barely moves with other load on the machine), and JAX's trace, lower and backend-compile
        seconds and counts (a persistent-cache hit counts as a compile request and a hit)."""
        from jax import monitoring

        if not getattr(_compile_report, "installed", False):
            monitoring.register_event_duration_secs_listener(_on_duration)
            monitoring.register_event_listener(_on_event)
            _compile_report.installed = True
        _totals.clear()
        start, cpu = time.perf_counter(), time.process_time()
        yield
        row = {"test": request.node.nodeid, "wall": round(time.perf_counter() - start, 3),
               "cpu": round(time.process_time() - cpu, 3),
               **{k: round(v, 3) for k, v in _totals.items()}}
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(f"{_REPORT}.{worker}.jsonl", "a") as out:
            out.write(json.dumps(row) + "\n")
