"""Host-side prefix cache: radix trees mapping token prefixes to KV slots. Pure Python + numpy, no JAX.

Public API: `RadixKey` (keys, EAGLE bigram view), `RadixCache` (plain full-attention tree), `SWARadixCache`
(hybrid sliding-window tree), `MatchResult`, `CachedReq` (a request as the cache sees it), `TreeState` (a
tree as plain data: `export_state` / `import_state`) with `allocate_state_slots`, the allocator protocols the
trees free through, and the exceptions. `cache.testing` has checked allocators for tests.
"""

from cache.allocator import SlotAllocator, SWASlotAllocator
from cache.errors import (
    CacheError,
    DoubleFreeError,
    EvictLockedError,
    ExtraKeyMismatchError,
    InvalidSlotsError,
    InvalidTokensError,
    InvariantError,
    LockError,
    OutOfSlotsError,
    PageAlignmentError,
    RequestStateError,
    StateError,
    ValueLengthError,
)
from cache.keys import RadixKey, match_units
from cache.match import MatchResult
from cache.radix_cache import RadixCache
from cache.request import CachedReq
from cache.state_slots import allocate_state_slots
from cache.tree_state import TreeState


def __getattr__(name: str):
    # SWARadixCache is imported on first use, so `import cache` never depends on the hybrid tree's modules.
    if name == "SWARadixCache":
        from cache.swa_radix_cache import SWARadixCache

        return SWARadixCache
    raise AttributeError(f"module 'cache' has no attribute {name!r}")


__all__ = [
    "CacheError",
    "CachedReq",
    "DoubleFreeError",
    "EvictLockedError",
    "ExtraKeyMismatchError",
    "InvalidSlotsError",
    "InvalidTokensError",
    "InvariantError",
    "LockError",
    "MatchResult",
    "OutOfSlotsError",
    "PageAlignmentError",
    "RadixCache",
    "RadixKey",
    "RequestStateError",
    "SWARadixCache",
    "SWASlotAllocator",
    "SlotAllocator",
    "StateError",
    "TreeState",
    "ValueLengthError",
    "allocate_state_slots",
    "match_units",
]
