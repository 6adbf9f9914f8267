"""Request-level operations of the plain tree: how a request's computed prefix goes into the tree. The
operations themselves (`admit`, `cache_unfinished_req`, `cache_finished_req`, `release_req`) and the ownership
model are shared with the SWA tree in `cache.request_ops`.

The plain `insert` frees nothing: it returns how many leading units were already cached, and the request's
slots for `[L, returned)` (`L = req.last_matched_prefix_len`) are duplicates that the request operations free
and replace by the tree's (after the re-match).

Correct where SGLang 0.5.3.post1 is not (`cache/README.md`, "Where we differ from SGLang"): SGLang takes the
duplicate range to free as `kv[len(prefix_indices) (-1 under EAGLE) : new_prefix_len]`. With `page_size > 1`
that start can fall inside a page whose first slots the request still uses, and the page-granular free then
releases them (a slot both free and live). Here the range always starts at `L`, the page-aligned end of what
the tree owned, so a duplicate range is whole pages the request owns, and the request's slots for them are
replaced by the tree's. Matched lengths and accounting equal SGLang's in its worked examples
(`cache/README.md`, "Appendix A"); the two can only differ where SGLang's own free breaks the ownership rule.
Also deliberate: `cache_finished_req` and `release_req` free every private slot, including any the caller
allocated beyond the tokens with KV.
"""

from __future__ import annotations

import numpy as np

from cache.keys import RadixKey
from cache.request_ops import RequestOps


class RadixRequestOps(RequestOps):
    """Mixin for `RadixCache`: the request operations of `cache.request_ops`, plain insert hook."""

    def _insert_req_prefix(
        self, key: RadixKey, token_bytes: bytes, kv: np.ndarray, owned: int, path: list | None
    ) -> tuple[np.ndarray, int]:
        """Insert (from the end of `path` when given), then hand back `kv[owned:num_cached]`: the request's
        duplicates of units the tree already had (whole pages the request owns), which are also the positions
        whose slots the re-match replaces."""
        if path is None:
            num_cached = self._insert(key, token_bytes, kv)
        else:
            num_cached = self._insert(key, token_bytes, kv, path, owned)
        stop = max(owned, num_cached)
        return kv[owned:stop], stop
