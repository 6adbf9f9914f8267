"""The SWA tree on jaxserve's real hybrid allocator (`jaxserve.memory.SWAAllocatorFacade`) instead of the
checked twin: the protocol fits (free, free_swa, move_swa, swa_slots_of, the free-id reports and pool sizes),
and the Appendix A numbers and the ownership checks hold the same."""

from __future__ import annotations

import pytest

from cache import CachedReq, SWARadixCache
from tests.cache.swa_sim import WORDS, run_request, serve_and_touch_long_prompt, serve_nine_prompts

facade = pytest.importorskip("jaxserve.memory.facade")
swa_allocator = pytest.importorskip("jaxserve.memory.swa_allocator")


def make_tree(page_size: int, eagle: bool, window: int) -> SWARadixCache:
    state = swa_allocator.make_swa_allocator(256 // page_size, 128 // page_size, page_size)
    alloc = facade.SWAAllocatorFacade(state)
    return SWARadixCache(alloc, sliding_window=window, page_size=page_size, eagle=eagle)


@pytest.mark.parametrize(("page_size", "eagle", "tree_units"), [(1, False, 36), (1, True, 35), (4, True, 32)])
def test_appendix_a_build_on_the_real_allocator(page_size: int, eagle: bool, tree_units: int) -> None:
    tree = make_tree(page_size, eagle, 4)
    serve_nine_prompts(tree)
    assert tree.check_invariants() == {
        "free": 256 - tree_units,
        "tree": tree_units,
        "live_only": 0,
        "swa_free": 128 - tree_units,
    }


@pytest.mark.parametrize("eagle", [False, True])
def test_tombstones_and_locked_revival_on_the_real_allocator(eagle: bool) -> None:
    tree = make_tree(1, eagle, 8)
    serve_nine_prompts(tree)
    longp = serve_and_touch_long_prompt(tree)
    assert tree.evict(0, 30) == (29, 30)
    live = CachedReq(last_node=tree.root)
    assert tree.admit(live, [*longp, 7]) == len(longp) - eagle  # holds the tombstoned "You" by a full lock
    run_request(tree, [*WORDS[:3], 77])  # recomputes "You are a" and revives the tombstone under the lock
    assert not any(n.tombstone for n in tree.iter_nodes())
    tree.check_invariants([live])
    tree.release_req(live)
    assert tree.check_invariants()["live_only"] == 0
