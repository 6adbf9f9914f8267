"""SGLang's own prefix caches, run in this process: `bench.cache`'s reference for the whole request path.

`load(sources)` imports SGLang 0.5.3.post1's `RadixCache`, `SWARadixCache`, their allocators and
`ReqToTokenPool` from `sources`, a directory holding the `sglang` package (`scripts/setup.sh` installs the
pinned wheel without its dependencies into `.venv/reference`: `default_sources()`). Only those classes'
modules run. SGLang's package `__init__` (its frontend) is skipped, and the few third-party modules its
cache modules import at module level for serving paths these classes never take (msgspec, pybase64,
requests, triton) are replaced by empty placeholders, registered only while the import runs. torch runs
for real: the caches keep their slots in torch tensors on the CPU, as they do in SGLang's scheduler.

`run(ref, kind, eagle, requests)` replays the benchmark's requests through them the way SGLang's scheduler
drives them (page size 1): take a request-to-token row, `match_prefix` of the prompt but its last token,
`inc_lock_ref`, evict what the allocator is short of, allocate the rest of the prompt, write the row, and
`cache_finished_req` with one sampled token (insert, free the duplicates and the tail, unlock, free the
row). Evicting the shortfall (`memory.evict_shortfall`, the function our `KVCache` calls) is our rule;
SGLang's scheduler asks its tree for the whole allocation instead, which evicts more than needed once the
pool is full, so both sides would no longer do the same work or keep the same prefixes. Page sizes above 1
are not run: SGLang's paged allocator allocates through a Triton kernel, which needs a GPU.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from jaxserve.memory import evict_shortfall

PINNED = "0.5.3.post1"
PLACEHOLDERS = ("msgspec", "pybase64", "requests", "triton")


def default_sources() -> Path:
    """Where `scripts/setup.sh` puts the pinned SGLang sources: `<venv>/reference`."""
    return Path(sys.prefix) / "reference"


class _Anything(types.ModuleType):
    """A placeholder module: every public attribute is an inert class (subclassable, callable,
    subscriptable), enough for module-level decorators, base classes and type hints."""

    def __getattr__(self, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        cls = type(name, (), {"__init__": lambda self, *a, **k: None,
                              "__call__": lambda self, *a, **k: None,
                              "__class_getitem__": classmethod(lambda c, item: c),
                              "__init_subclass__": classmethod(lambda c, **k: None)})
        setattr(self, name, cls)
        return cls


class _PlaceholderFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in PLACEHOLDERS:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Anything(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module) -> None:
        pass


@contextlib.contextmanager
def _placeholders() -> Iterator[None]:
    """Placeholder modules for `PLACEHOLDERS` not installed, while the block runs (real ones win)."""
    missing = [n for n in PLACEHOLDERS if n not in sys.modules and importlib.util.find_spec(n) is None]
    finder = _PlaceholderFinder()
    sys.meta_path.append(finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in [m for m in sys.modules if m.split(".")[0] in missing]:
            del sys.modules[name]


def load(sources: Path | str) -> types.SimpleNamespace:
    """SGLang's cache classes from `sources` (see the module docstring). Raises FileNotFoundError when
    `sources` holds no `sglang` package, and ValueError when its version is not `PINNED`."""
    root = Path(sources) / "sglang"
    if not (root / "srt" / "mem_cache" / "radix_cache.py").is_file():
        raise FileNotFoundError(f"no SGLang sources under {sources} (scripts/setup.sh installs them into "
                                f"{default_sources()})")
    version = (root / "version.py").read_text()
    if f'"{PINNED}"' not in version:
        raise ValueError(f"SGLang under {sources} is not {PINNED}: {version.strip()}")
    for name, path in (("sglang", root), ("sglang.srt", root / "srt")):
        if name not in sys.modules:  # namespace stand-ins: the package __init__ files do not run
            package = types.ModuleType(name)
            package.__path__ = [str(path)]
            sys.modules[name] = package
    with _placeholders():
        radix = importlib.import_module("sglang.srt.mem_cache.radix_cache")
        swa = importlib.import_module("sglang.srt.mem_cache.swa_radix_cache")
        allocator = importlib.import_module("sglang.srt.mem_cache.allocator")
        pool = importlib.import_module("sglang.srt.mem_cache.memory_pool")
    return types.SimpleNamespace(RadixCache=radix.RadixCache, RadixKey=radix.RadixKey,
                                 SWARadixCache=swa.SWARadixCache, SWAKVPool=pool.SWAKVPool,
                                 TokenToKVPoolAllocator=allocator.TokenToKVPoolAllocator,
                                 SWATokenToKVPoolAllocator=allocator.SWATokenToKVPoolAllocator,
                                 ReqToTokenPool=pool.ReqToTokenPool)


def make_tree(ref: types.SimpleNamespace, kind: str, eagle: bool, num_slots: int, sliding_window: int,
              max_tokens: int):
    """(tree, allocator, request-to-token pool) as SGLang's scheduler builds them at page size 1, with
    `num_slots` KV slots (full and SWA alike) and rows of `max_tokens`."""
    import torch

    pool = ref.ReqToTokenPool(4, max_tokens, "cpu", False)
    if kind == "full":
        alloc = ref.TokenToKVPoolAllocator(num_slots, torch.bfloat16, "cpu", None, False)
        return ref.RadixCache(pool, alloc, page_size=1, is_eagle=eagle), alloc, pool
    # the hybrid allocator asks for an SWAKVPool only to hand its sub-pools out; no KV buffer is needed here
    kv = ref.SWAKVPool.__new__(ref.SWAKVPool)
    kv.full_kv_pool = kv.swa_kv_pool = None
    alloc = ref.SWATokenToKVPoolAllocator(num_slots, num_slots, torch.bfloat16, "cpu", kv, False)
    return ref.SWARadixCache(pool, alloc, sliding_window, page_size=1, is_eagle=eagle), alloc, pool


def run(ref: types.SimpleNamespace, kind: str, eagle: bool, requests: list[np.ndarray], *, num_slots: int,
        sliding_window: int, clock=time.process_time, reused: list[int] | None = None) -> tuple[float, int]:
    """(seconds on `clock`, slots reused from the tree) over `requests` (prompts), as the module docstring
    says; the prompts' conversion to lists is not timed (token lists are SGLang's input). `reused`, when
    given, gets each request's reused slots appended."""
    lists = [r.tolist() for r in requests]
    tree, alloc, pool = make_tree(ref, kind, eagle, num_slots, sliding_window, max(map(len, lists)) + 2)
    swa, key = kind == "swa", ref.RadixKey
    matched = 0
    t0 = clock()
    for prompt in lists:
        row = pool.alloc(1)[0]
        found = tree.match_prefix(key(prompt[:-1]))
        prefix, node = found.device_indices, found.last_device_node
        uuid = tree.inc_lock_ref(node)
        need = len(prompt) - len(prefix)
        evict_shortfall(tree, alloc, need, hybrid=swa)
        new = alloc.alloc(need)
        pool.write((row, slice(0, len(prefix))), prefix)
        pool.write((row, slice(len(prefix), len(prompt))), new)
        req = types.SimpleNamespace(req_pool_idx=row, origin_input_ids=prompt, output_ids=[0],
                                    prefix_indices=prefix, last_matched_prefix_len=len(prefix),
                                    extra_key=None, last_node=node, swa_uuid_for_lock=uuid)
        tree.cache_finished_req(req)
        matched += len(prefix)
        if reused is not None:
            reused.append(len(prefix))
    return clock() - t0, matched
