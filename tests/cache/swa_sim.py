"""Test helper: drive an `SWARadixCache` the way the scheduler will (admit, chunked prefill, decode, finish),
with slots allocated page by page from a `CheckedSWAAllocator`. Not a test module."""

from __future__ import annotations

import numpy as np

from cache import CachedReq, SWARadixCache
from cache.keys import SLOT_DTYPE
from cache.testing import CheckedSWAAllocator

WORDS = list(range(100, 109))  # "You are a helpful , respectful and honest assistant" (Appendix A)
XXX = 109
OUTPUT = [900, 901, 902]


def make_swa(
    num_full: int, num_swa: int, *, window: int, page_size: int = 1, eagle: bool = False, **kw
) -> tuple[SWARadixCache, CheckedSWAAllocator]:
    alloc = CheckedSWAAllocator(num_full, num_swa, page_size)
    return SWARadixCache(alloc, sliding_window=window, page_size=page_size, eagle=eagle, **kw), alloc


def extend_slots(tree: SWARadixCache, req: CachedReq, num_new: int) -> bool:
    """Give `req` slots for its next `num_new` positions: first the rest of its partial last page (its own,
    SWA already mapped page-wise), then fresh pages, evicting from the tree (both pools) when short.
    False (nothing changed) if the pools cannot supply them."""
    page_size, alloc = tree.page_size, tree.allocator
    kv = req.kv_slots
    in_page = min(-kv.shape[0] % page_size, num_new)
    head = kv[-1] + 1 + np.arange(in_page, dtype=SLOT_DTYPE) if in_page else np.zeros(0, SLOT_DTYPE)
    rest = num_new - in_page
    fresh = np.zeros(0, SLOT_DTYPE)
    if rest:
        need = -(-rest // page_size) * page_size
        full_short = need - alloc.full_available_size()
        swa_short = need - alloc.swa_available_size()
        if full_short > 0 or swa_short > 0:
            tree.evict(max(full_short, 0), max(swa_short, 0))
        fresh = alloc.alloc(rest)
        if fresh is None:
            return False
    req.kv_slots = np.concatenate([kv, head, fresh])
    return True


def run_request(
    tree: SWARadixCache, prompt: list[int], output: list[int] = OUTPUT, chunk: int | None = None
) -> int:
    """Admit `prompt`, prefill it (in chunks of `chunk` tokens, each but the last followed by
    `cache_unfinished_req`), decode `output` (the last sampled token gets no KV), finish. Returns the
    admission match. Raises AssertionError if the pools run dry."""
    req = CachedReq(last_node=tree.root)
    admitted = tree.admit(req, prompt)
    if chunk is not None:
        stop = req.prefix_len
        while len(prompt) - stop > chunk:
            stop += chunk
            assert extend_slots(tree, req, stop - req.kv_slots.shape[0])
            tree.cache_unfinished_req(req, prompt[:stop])
    num_kv = len(prompt) + len(output) - 1
    assert extend_slots(tree, req, num_kv - req.kv_slots.shape[0])
    tree.cache_finished_req(req, prompt + output)
    return admitted
