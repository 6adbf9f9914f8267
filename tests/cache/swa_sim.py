"""Test helper: drive an `SWARadixCache` the way the scheduler will (admit, chunked prefill, decode, finish),
with slots allocated page by page from a `CheckedSWAAllocator`. Not a test module."""

from __future__ import annotations

from cache import CachedReq, SWARadixCache
from cache.testing import CheckedSWAAllocator
from tests.cache.sim_slots import grow_kv_slots

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
    alloc = tree.allocator

    def make_room(need: int) -> None:
        full_short = need - alloc.full_available_size()
        swa_short = need - alloc.swa_available_size()
        if full_short > 0 or swa_short > 0:
            tree.evict(max(full_short, 0), max(swa_short, 0))

    return grow_kv_slots(req, num_new, alloc, make_room)


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


def serve_nine_prompts(tree: SWARadixCache) -> list[int]:
    """Appendix A: serve "You", "You are", ... (WORDS[:k], k = 1..9), each followed by XXX and decoded to
    OUTPUT, one after the other. Returns the admission matches."""
    return [run_request(tree, [*WORDS[:k], XXX]) for k in range(1, 10)]


def serve_and_touch_long_prompt(tree: SWARadixCache) -> list[int]:
    """Serve the whole sentence plus [1..6] as one more request, then touch it by a match (so the leaf
    [900, 901] is split off, and the sentence's path is the most recent). Returns that prompt."""
    longp = [*WORDS, 1, 2, 3, 4, 5, 6]
    run_request(tree, longp)
    tree.match_prefix(longp)
    return longp
