"""`cache` is host-side only: importing it (and using the plain tree) must not import jax."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys
import cache, cache.testing, cache.radix_cache, cache.radix_requests, cache.radix_invariants
from cache import RadixCache, CachedReq
from cache.testing import CheckedAllocator
alloc = CheckedAllocator(16)
tree = RadixCache(alloc)
req = CachedReq(last_node=tree.root)
tree.admit(req, [1, 2, 3])
tree.check_invariants(live_reqs=[req])
bad = sorted(m for m in sys.modules if m == "jax" or m.startswith(("jax.", "jaxlib", "flax", "torch")))
assert not bad, bad
print("ok")
"""


def test_importing_cache_does_not_import_jax() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
