"""Test-wide settings.

- JAX's persistent compilation cache lives in the clone (git-ignored .jax_cache/).
- XLA's optimisation passes are off (`JAX_DISABLE_MOST_OPTIMIZATIONS`, inherited by the servers and
  children the tests start): the suite compiles some four thousand programs for tiny models, and at these
  sizes the passes cost far more compile time than they save at run time (one run of the spec-tree and
  layer-scan tests: 278 s with them, 185 s without). What the tests assert does not depend on them: greedy
  equality and parity tolerances hold either way. Tests that assert on the compiled HLO itself (donated
  pools updated in place, no pool copy) are marked `xla_optimized` and compile as production does.
"""

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
