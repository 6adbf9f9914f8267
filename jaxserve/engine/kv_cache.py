"""`KVCache`: the pools, the allocator and the prefix tree of one engine, and the scheduler's memory verbs.

Picks the plain `RadixCache` over one `KVPool`, or for hybrid sliding-window models (gpt-oss, Gemma) the
`SWARadixCache` over a `HybridKVPool` with an SWA allocator (window from the model config, in tokens
including self). The device pools live here too; only the runner replaces them (donated each step).

Units: slots (token positions in the pool), pages of `page_size` slots. Ownership follows `cache`: a slot is
free (allocator), in the tree, or private to one live request (`CachedReq.kv_slots[last_matched:]`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
from jax.sharding import Mesh

from cache import CachedReq, RadixCache
from jaxserve.memory import (
    AllocatorFacade,
    SWAAllocatorFacade,
    evict_shortfall,
    make_allocator,
    make_swa_allocator,
)
from jaxserve.models.config import ModelConfig
from jaxserve.models.kv_layout import KVLayout
from jaxserve.models.sharding import TP, make_sharded_pools, tp_layout


class KVCache:
    """Pools + allocator facade + tree for a model. `num_pages` full pages (plus reserved page 0);
    hybrid models get `swa_num_pages` SWA pages. `eagle`: the tree keys bigrams (speculative decoding with
    an EAGLE draft, whose KV at a position depends on the next token). `mesh`: tensor parallelism - the
    pools are sharded on kv heads over its `tp` axis (kv heads replicated up to tp when fewer; see
    `jaxserve.models.sharding`); slots, pages and the tree stay global (one allocator for all shards)."""

    def __init__(self, config: ModelConfig, *, num_pages: int, page_size: int, kv_dtype,
                 disable_radix_cache: bool, swa_num_pages: int | None = None, eagle: bool = False,
                 mesh: Mesh | None = None) -> None:
        self.page_size = page_size
        self.num_pages = num_pages
        self.layout = KVLayout.from_config(config)
        self.mesh = mesh
        if mesh is not None:
            self.layout = tp_layout(self.layout, mesh.shape[TP])
        self.hybrid = self.layout.hybrid
        if self.hybrid:
            from cache import SWARadixCache

            self.swa_num_pages = swa_num_pages or num_pages
            self.sliding_window: int | None = int(config.sliding_window)
            self.allocator = SWAAllocatorFacade(make_swa_allocator(num_pages, self.swa_num_pages, page_size))
            self.tree = SWARadixCache(self.allocator, sliding_window=int(config.sliding_window),
                                      page_size=page_size, disabled=disable_radix_cache, eagle=eagle)
        else:
            self.swa_num_pages = None
            self.sliding_window = None
            self.allocator = AllocatorFacade(make_allocator(num_pages, page_size))
            self.tree = RadixCache(self.allocator, page_size=page_size, disabled=disable_radix_cache,
                                   eagle=eagle)
        if mesh is None:
            self.pools = self.layout.make_pools(num_pages, page_size, kv_dtype,
                                                swa_num_pages=self.swa_num_pages)
        else:
            self.pools = make_sharded_pools(self.layout, mesh, num_pages, page_size, kv_dtype,
                                            swa_num_pages=self.swa_num_pages)

    # ------------------------------------------------------------------ sizes
    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    def available_slots(self) -> int:
        """Free full slots (the scarcer side for hybrid pools when the ratio is 1)."""
        if self.hybrid:
            return min(self.allocator.full_available_size(), self.allocator.swa_available_size())
        return self.allocator.available_size()

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def fits_alone(self, num_tokens: int) -> bool:
        """Can a request with `num_tokens` tokens of KV ever run (the whole pool, tree evicted)?"""
        return num_tokens <= self.max_request_tokens

    @property
    def max_request_tokens(self) -> int:
        """The most tokens of KV one request can ever hold: the whole pool (both groups when hybrid)."""
        swa_pages = self.swa_num_pages if self.hybrid else self.num_pages
        return min(self.num_pages, swa_pages) * self.page_size

    # ------------------------------------------------------------------ allocation
    def reserve(self, num_slots: int) -> bool:
        """Evict least-recently-used unlocked tree nodes until `num_slots` slots are free (or nothing more is
        evictable). Takes nothing: returns whether `num_slots` slots are free now."""
        self._evict_for(num_slots)
        return self.available_slots() >= num_slots

    def shrink(self, req: CachedReq, num_tokens: int) -> None:
        """Keep `req`'s slots for positions `[0, num_tokens)`; the whole pages past
        `ceil(num_tokens / page_size)` go back to the allocator now. Slots past `num_tokens` inside the kept
        last page stay the request's own (a later `extend` continues them)."""
        slots = req.kv_slots
        tail = slots[self.pages_for(num_tokens) * self.page_size:]
        if tail.shape[0]:
            self.allocator.free(tail)
        req.truncate_slots(min(num_tokens, slots.shape[0]))

    def shrink_many(self, shrinks: list[tuple[CachedReq, int]]) -> None:
        """`shrink` for several (request, num_tokens) at once, with one allocator free for all their
        tails (the pages past each request's `num_tokens`)."""
        ps = self.page_size
        tails = [req.kv_slots[self.pages_for(n) * ps:] for req, n in shrinks]
        tails = [t for t in tails if t.shape[0]]
        if tails:
            self.allocator.free(np.concatenate(tails) if len(tails) > 1 else tails[0])
        for req, n in shrinks:
            req.truncate_slots(min(n, req.kv_slots.shape[0]))

    def _evict_for(self, num_slots: int) -> None:
        evict_shortfall(self.tree, self.allocator, num_slots, hybrid=self.hybrid)

    def extend(self, req: CachedReq, start: int, stop: int) -> bool:
        """Give `req` slots for positions `[start, stop)` (start == len(req.kv_slots)), evicting tree nodes
        first if short. The slots become the request's (appended to `kv_slots`). Returns False, with
        nothing taken, when the pool cannot hold them even after eviction."""
        if start != req.kv_slots.shape[0] or stop <= start:
            raise ValueError(f"extend [{start}, {stop}) does not continue {req.kv_slots.shape[0]} slots")
        new_pages = self.pages_for(stop) - self.pages_for(start)
        if new_pages == 0:  # inside the request's own partial last page: no allocator call needed
            last_loc = int(req.kv_slots[start - 1])
            req.append_slots(np.arange(last_loc + 1, last_loc + 1 + stop - start))
            return True
        self._evict_for(new_pages * self.page_size)
        last_loc = int(req.kv_slots[start - 1]) if start else 0
        slots = self.allocator.alloc_extend(np.array([start]), np.array([stop]), np.array([last_loc]))
        if slots is None:
            return False
        req.append_slots(slots)
        return True

    def extend_many(self, spans: list[tuple[CachedReq, int, int]]) -> bool:
        """`extend` for several requests with one allocator call, all or nothing (False: nothing taken)."""
        paged, inside, new_pages = [], [], 0
        for span in spans:
            n = self.pages_for(span[2]) - self.pages_for(span[1])
            if n > 0:
                paged.append(span)
                new_pages += n
            else:
                inside.append(span)
        if paged:
            self._evict_for(new_pages * self.page_size)
            last = [int(r.kv_slots[a - 1]) if a else 0 for r, a, _ in paged]
            slots = self.allocator.alloc_extend(np.array([a for _, a, _ in paged]),
                                                np.array([b for _, _, b in paged]), np.array(last))
            if slots is None:
                return False
            lo = 0
            for req, a, b in paged:
                hi = lo + b - a
                req.append_slots(slots[lo:hi])
                lo = hi
        for req, start, stop in inside:
            self.extend(req, start, stop)  # inside its own partial page: cannot fail
        return True

    # ------------------------------------------------------------------ step inputs
    def page_ids(self, req: CachedReq, num_tokens: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Full-group page ids covering positions `[0, num_tokens)`, and the SWA group's (0 where a
        tombstone freed them) for hybrid pools, else None."""
        full, swa = self.page_ids_many([req], [num_tokens])
        return full[0], None if swa is None else swa[0]

    def page_ids_many(self, reqs: Sequence[CachedReq], num_tokens: Sequence[int],
                      swa_from: Sequence[int] | None = None
                      ) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
        """`page_ids` for many requests at once: `(full, swa)` with `full[i]` the int32 full-group page ids
        covering positions `[0, num_tokens[i])` of `reqs[i]` (`ceil(num_tokens[i] / page_size)` of them, or
        fewer if the request holds fewer slots, exactly as `page_ids`), and `swa[i]` the SWA group's (0 where
        a tombstone freed the SWA page) for hybrid pools; `swa` is None for non-hybrid pools. `swa_from[i]`
        (hybrid pools): map only the pages from the one holding position `swa_from[i]` on, so `swa[i]` starts
        at page index `self.swa_first_page(swa_from[i])` (see `SequenceStep.swa_first_page`); None: all.

        The full group comes from each request's persistent page row (`CachedReq.page_ids`: O(pages added
        since the last step), never O(context)); the arrays are read-only views of those rows, valid until
        the request's slots change (copy to keep them). The SWA group is mapped through the allocator at
        every call (a tombstone may free an SWA page at any time), all requests in ONE `swa_slots_of` call
        (per-call overhead, not the slot count, dominates it); with `swa_from` that costs O(window) per
        request. Raises ValueError if the lists differ in length; SlotRangeError /
        StaleAllocatorStateError from the SWA mapping."""
        if len(reqs) != len(num_tokens) or (swa_from is not None and len(swa_from) != len(reqs)):
            raise ValueError(f"page_ids_many: {len(reqs)} requests but {len(num_tokens)} token counts"
                             + ("" if swa_from is None else f" and {len(swa_from)} window starts"))
        p = self.page_size
        full = [req.page_ids(p, n) for req, n in zip(reqs, num_tokens, strict=True)]
        if not self.hybrid:
            return full, None
        if not full:
            return [], []
        los = [0] * len(reqs) if swa_from is None else [self.swa_first_page(a) for a in swa_from]
        firsts = [req.kv_slots[lo * p: n: p] for req, n, lo in zip(reqs, num_tokens, los, strict=True)]
        flat = np.concatenate(firsts)
        bounds = list(itertools.accumulate((f.shape[0] for f in firsts), initial=0))
        swa_flat = self.allocator.swa_slots_of(flat)
        swa_flat = (swa_flat // p if p > 1 else swa_flat).astype(np.int32)
        swa_flat.flags.writeable = False
        return full, [swa_flat[lo:hi] for lo, hi in itertools.pairwise(bounds)]

    def swa_first_page(self, position: int) -> int:
        """The page index holding `position` (what `page_ids_many(..., swa_from)` starts the SWA ids at)."""
        return max(position, 0) // self.page_size

    def window_start(self, first_query: int) -> int:
        """The first position a query at `first_query` or later can see through the sliding window (0 for a
        pool without one): the window counts the query itself."""
        return 0 if self.sliding_window is None else max(first_query - self.sliding_window + 1, 0)

    # ------------------------------------------------------------------ checks and reset
    def check(self, live: list[CachedReq] = ()) -> dict[str, int]:
        """Prove the ownership rules (free / tree / live-private partition every page); returns counts."""
        return self.tree.check_invariants(list(live))

    def tree_slots(self) -> int:
        return int(self.tree.total_size())

    def flush(self) -> None:
        """Drop the whole tree, freeing its slots, then restart the allocator from a fresh state (so slot
        ids after a flush are what a new engine would hand out). The caller guarantees no live request holds
        slots; raises RuntimeError if any slot is still owned after the tree's are freed (a leak)."""
        self.tree.reset()
        if self.hybrid:
            free = (self.allocator.full_available_size(), self.allocator.swa_available_size())
            if free != (self.num_slots, self.swa_num_pages * self.page_size):
                raise RuntimeError(f"flush: {free} slots free of {self.num_slots} full / "
                                   f"{self.swa_num_pages * self.page_size} SWA: a live request or a leak")
            self.allocator.state = make_swa_allocator(self.num_pages, self.swa_num_pages, self.page_size)
        else:
            free = self.allocator.available_size()
            if free != self.num_slots:
                raise RuntimeError(f"flush: {free} of {self.num_slots} slots free: a live request or a leak")
            self.allocator.state = make_allocator(self.num_pages, self.page_size)
