"""Bad input raises a specific exception and leaves the tree, the allocator and the request as they were."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from cache import (
    EvictLockedError,
    ExtraKeyMismatchError,
    InvalidSlotsError,
    InvalidTokensError,
    LockError,
    PageAlignmentError,
    RadixKey,
    RequestStateError,
    ValueLengthError,
)
from tests.cache.radix_sim import admit, make_cache, prefill
from tests.cache.rejects import assert_rejected_unchanged


def snapshot(cache) -> tuple:
    return (
        cache.pretty(max_units=64),
        cache.evictable_size,
        cache.protected_size,
        cache.num_nodes,
        cache.allocator.available_size(),
    )


def populated(page_size: int = 1, eagle: bool = False):
    """A tree with a shared prefix, a locked path and a live chunked request."""
    cache, alloc = make_cache(64 * page_size, page_size, eagle)
    tokens = list(range(1, 4 * page_size + 2))
    cache.insert(tokens[: 4 * page_size + eagle], alloc.alloc(4 * page_size))
    locked = cache.match_prefix(tokens[: 2 * page_size + eagle]).node
    cache.inc_lock_ref(locked)
    sim = admit(cache, [*tokens[: 3 * page_size], 50, 51, 52])
    assert prefill(cache, sim, 1)
    LIVE[id(cache)] = [sim.req]
    return cache, alloc, tokens, locked, sim


def scratch(alloc, num_slots: int) -> np.ndarray:
    """Well-formed slots that a rejected call must never take (free ones: taking them would show)."""
    return alloc.free_slot_ids()[:num_slots]


def assert_rejected(
    cache, exc: type[Exception], call: Callable[[], object], match: str | None = None
) -> None:
    assert_rejected_unchanged(cache, snapshot, call, exc, match, LIVE.get(id(cache), []))


LIVE: dict[int, list] = {}  # id(cache) -> live requests of `populated` trees


@pytest.mark.parametrize(
    ("tokens", "match"),
    [([1, -2, 3], ">= 0"), ([1.0, 2.0], "integers"), ([[1, 2]], "1-D"), ([1, 2**40], "int32"), ("abc", None)],
)
@pytest.mark.parametrize("page_size", [1, 4])
def test_invalid_token_ids_are_rejected_everywhere(tokens, match, page_size: int) -> None:
    cache, alloc, _, _, sim = populated(page_size)
    slots = scratch(alloc, 4 * page_size)
    assert_rejected(cache, InvalidTokensError, lambda: cache.match_prefix(tokens), match)
    assert_rejected(cache, InvalidTokensError, lambda: cache.insert(tokens, slots), match)
    kv = sim.req.kv_slots.copy()
    assert_rejected(cache, InvalidTokensError, lambda: cache.cache_unfinished_req(sim.req, tokens), match)
    assert_rejected(cache, InvalidTokensError, lambda: cache.cache_finished_req(sim.req, tokens), match)
    assert np.array_equal(sim.req.kv_slots, kv)


@pytest.mark.parametrize("eagle", [False, True])
def test_mismatched_key_and_value_lengths(eagle: bool) -> None:
    cache, alloc, _, _, _ = populated(eagle=eagle)
    slots = scratch(alloc, 8)
    key = [1, 2, 9, 9, 9]  # would split the cached [1..4] node if accepted
    assert_rejected(cache, ValueLengthError, lambda: cache.insert(key, slots[: len(key) - eagle - 1]))
    if not eagle:  # under EAGLE extra slots are allowed (R4) and simply not stored
        assert_rejected(cache, ValueLengthError, lambda: cache.insert(key, slots[: len(key) + 1]))


def test_key_that_is_not_whole_pages_is_rejected() -> None:
    cache, alloc, _, _, _ = populated(page_size=4)
    slots = scratch(alloc, 8)
    assert_rejected(
        cache, PageAlignmentError, lambda: cache.insert(list(range(1, 7)), slots[:6]), "page_size=4"
    )


def test_page_misaligned_or_reserved_values_are_rejected() -> None:
    cache, alloc, _, _, _ = populated(page_size=4)
    key = [1, 2, 3, 4, 9, 9, 9, 9]  # would split after the first page if accepted
    page = scratch(alloc, 4)
    assert_rejected(cache, PageAlignmentError, lambda: cache.insert(key, np.concatenate([page, page[::-1]])))
    assert_rejected(
        cache, PageAlignmentError, lambda: cache.insert(key, np.arange(102, 110))
    )  # straddles pages
    assert_rejected(
        cache, InvalidSlotsError, lambda: cache.insert(key, np.arange(0, 8))
    )  # page 0 is reserved
    assert_rejected(cache, InvalidSlotsError, lambda: cache.insert(key, np.arange(8, 16) * 1.0))
    assert_rejected(cache, InvalidSlotsError, lambda: cache.insert(key, np.arange(8, 16).reshape(2, 4)))


def test_negative_slots_are_rejected() -> None:
    cache, _, _, _, _ = populated()
    assert_rejected(cache, InvalidSlotsError, lambda: cache.insert([7, 8], [-1, 5]))


def test_unlocking_an_unlocked_node() -> None:
    cache, _, tokens, _, _ = populated()
    unlocked = cache.match_prefix(tokens[:4]).node
    assert unlocked.lock_ref == 0
    assert_rejected(cache, LockError, lambda: cache.dec_lock_ref(unlocked), "holds no lock")


def test_locking_or_unlocking_a_node_not_in_the_tree() -> None:
    cache, alloc, _, _, _ = populated()
    cache.insert([40, 41], alloc.alloc(2))  # evicted below: back to the allocator
    gone = cache.match_prefix([40, 41]).node
    cache.evict_subtree(gone)
    other, _ = make_cache(16)  # its slots are its own allocator's
    other.insert([1], other.allocator.alloc(1))
    foreign = other.match_prefix([1]).node
    for node in (gone, foreign):
        assert_rejected(cache, LockError, lambda n=node: cache.inc_lock_ref(n), "not in this tree")
        assert_rejected(cache, LockError, lambda n=node: cache.dec_lock_ref(n), "not in this tree")


def test_evicting_a_locked_path_explicitly() -> None:
    cache, _, _, locked, _ = populated()
    assert_rejected(cache, EvictLockedError, lambda: cache.evict_subtree(locked), "locked")
    assert_rejected(cache, EvictLockedError, lambda: cache.evict_subtree(cache.root), "locked")
    assert_rejected(cache, EvictLockedError, lambda: cache.reset(), "locked")


def test_evict_subtree_of_an_unlocked_branch_frees_it() -> None:
    cache, _, tokens, _, _ = populated()
    branch = cache.match_prefix(tokens[:4]).node  # [4], below [1,2] (locked) and [3] (the request's path)
    assert branch.key.tokens.tolist() == [4] and branch.lock_ref == 0
    assert cache.evict_subtree(branch) == 1
    assert cache.match_prefix(tokens[:4]).slots.shape[0] == 3
    cache.check_invariants(live_reqs=LIVE[id(cache)])


def test_extra_key_conflict_between_key_and_argument() -> None:
    cache, _, _, _, _ = populated()
    key = RadixKey.of([1, 2, 3], extra_key="a")
    assert_rejected(cache, ExtraKeyMismatchError, lambda: cache.match_prefix(key, extra_key="b"))


def test_request_state_errors() -> None:
    cache, _, tokens, _, sim = populated()
    req = sim.req
    kv = req.kv_slots.copy()
    assert_rejected(cache, RequestStateError, lambda: cache.admit(req, tokens), "fresh request")
    short = sim.prompt[: req.prefix_len - 1]
    assert_rejected(
        cache, RequestStateError, lambda: cache.cache_unfinished_req(req, short), "already covers"
    )
    longer = [*sim.prompt, 1, 2, 3]  # more tokens than the request holds slots for
    assert_rejected(cache, RequestStateError, lambda: cache.cache_unfinished_req(req, longer), "holds")
    assert_rejected(cache, RequestStateError, lambda: cache.cache_finished_req(req, short), "already covers")
    assert np.array_equal(req.kv_slots, kv)
    cache.check_invariants(live_reqs=[req])
