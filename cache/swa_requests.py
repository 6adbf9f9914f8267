"""Request-level operations of the SWA tree: how a request's computed prefix goes
into the tree. The operations themselves (`admit`, `cache_unfinished_req`, `cache_finished_req`,
`release_req`) and the ownership model are shared with the plain tree in `cache.request_ops`; here a
request's private slots have their SWA slots mapped, and its lock full-locks the path and SWA-locks the path's
last `sliding_window` units.

The SWA `insert` frees the request's duplicates itself (everything beyond `prev_prefix_len = L`, with
`L = req.last_matched_prefix_len`) and revives the tombstones it overlaps there, so no duplicate is left for
the request operations to free, and any slot in `[L, inserted units)` may have changed.

Where this is correct and SGLang 0.5.3.post1 is not:
- SGLang passes `prev_prefix_len = len(prefix_indices)` (minus 1 under EAGLE); with `page_size > 1` that may
  fall inside a page the request still uses, and the page-granular free of "duplicates" then releases it.
  Here `prev_prefix_len = L` always, so the duplicate range is whole pages the request owns (for EAGLE at
  P=1 this is exactly SGLang's −1 rule).
- After a chunk's insert, the re-match covers everything inserted: positions below `L` are the old match,
  whose last window is SWA-locked (so the window rule still holds there), and every tombstone at or beyond
  `L` was revived by the insert. So no slot the request still uses is ever freed as a "duplicate" (the PD/SWA
  re-match bug, SGLang PR #40681); a shorter re-match would raise InvariantError rather than corrupt state.
- Revival keeps the node's full slots (see `cache.swa_radix_cache`), so a live request that reads a
  tombstoned node beyond its window never sees its slots freed.
Matched lengths and accounting equal SGLang's wherever SGLang keeps the ownership rule (`cache/README.md`,
"Appendix A").
"""

from __future__ import annotations

import numpy as np

from cache.keys import RadixKey
from cache.request_ops import RequestOps
from cache.slots import EMPTY_SLOTS


class SWARequestOps(RequestOps):
    """Mixin for `SWARadixCache`: the request operations of `cache.request_ops`, SWA insert hook."""

    def _insert_req_prefix(
        self, key: RadixKey, token_bytes: bytes, kv: np.ndarray, owned: int, path: list | None
    ) -> tuple[np.ndarray, int]:
        """Insert with `prev_prefix_len = owned` (from the end of `path` when given): the tree frees the
        duplicates and revives tombstones, so nothing is left to free, and every position in
        `[owned, len(kv))` may now hold a different slot."""
        self._insert(key, token_bytes, kv, owned, path or ())
        return EMPTY_SLOTS, kv.shape[0]
