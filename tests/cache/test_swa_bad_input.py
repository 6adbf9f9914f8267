"""Bad input to the SWA tree raises a specific exception with a useful message and leaves the tree (and the
allocator) exactly as it was."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from cache import (
    CachedReq,
    EvictLockedError,
    ExtraKeyMismatchError,
    InvalidSlotsError,
    InvalidTokensError,
    LockError,
    PageAlignmentError,
    RadixKey,
    RequestStateError,
    SWARadixCache,
    ValueLengthError,
)
from cache.testing import CheckedSWAAllocator
from tests.cache.rejects import assert_rejected_unchanged
from tests.cache.swa_sim import extend_slots, make_swa


def snapshot(tree: SWARadixCache) -> tuple:
    alloc = tree.allocator
    return (
        tree.pretty(max_units=64),
        list(tree.full_lru.owners_mru_first()),
        list(tree.swa_lru.owners_mru_first()),
        tree.full_evictable_size,
        tree.full_protected_size,
        tree.swa_evictable_size,
        tree.swa_protected_size,
        alloc.free_slot_ids().tolist(),
        alloc.free_swa_slot_ids().tolist(),
    )


@pytest.fixture
def setup() -> tuple[SWARadixCache, CheckedSWAAllocator, CachedReq]:
    """A P=2 tree with a tombstone, a locked request and an evictable branch."""
    tree, alloc = make_swa(64, 64, window=2, page_size=2)
    tree.insert([1, 2, 3, 4], alloc.alloc(4))
    tree.insert([1, 2, 3, 4, 5, 6], alloc.alloc(6))
    tree.match_prefix([1, 2, 3, 4, 5, 6])
    tree.insert([7, 8], alloc.alloc(2))
    assert tree.evict(0, 2) == (0, 4)  # [1,2,3,4] becomes a tombstone
    req = CachedReq(last_node=tree.root)
    tree.admit(req, [1, 2, 3, 4, 5, 6, 9])
    assert extend_slots(tree, req, 2)
    tree.check_invariants([req])
    return tree, alloc, req


def unchanged(
    setup: tuple, call: Callable[[], object], error: type[Exception], match: str
) -> None:
    tree, _, req = setup
    assert_rejected_unchanged(tree, snapshot, call, error, match, [req])


@pytest.mark.parametrize(
    ("tokens", "match"),
    [
        ([1, -2, 3, 4], ">= 0"),
        ([1.5, 2.0], "integers"),
        (["a", "b"], "integers"),
        ([[1, 2], [3, 4]], "1-D"),
        ([1, 2**40], "int32"),
    ],
)
def test_invalid_token_ids(setup: tuple, tokens: list, match: str) -> None:
    tree, _alloc, req = setup
    unchanged(setup, lambda: tree.match_prefix(tokens), InvalidTokensError, match)
    unchanged(setup, lambda: tree.insert(tokens, np.arange(2, 6)), InvalidTokensError, match)
    fresh = CachedReq(last_node=tree.root)
    unchanged(setup, lambda: tree.admit(fresh, tokens), InvalidTokensError, match)
    unchanged(setup, lambda: tree.cache_finished_req(req, tokens), InvalidTokensError, match)


def free_pages(alloc: CheckedSWAAllocator, num_slots: int) -> np.ndarray:
    """Whole, ordered pages of free slot ids, *not* allocated: insert must reject the call before use."""
    return alloc.free_slot_ids()[:num_slots]


def test_mismatched_key_and_value_lengths(setup: tuple) -> None:
    tree, alloc, _ = setup
    slots = free_pages(alloc, 4)
    unchanged(setup, lambda: tree.insert([1, 2, 3, 4], slots[:2]), ValueLengthError, "4 units")
    unchanged(setup, lambda: tree.insert([1, 2], slots), ValueLengthError, "2 units")


def test_page_misaligned_keys_and_values(setup: tuple) -> None:
    tree, alloc, _ = setup
    slots = free_pages(alloc, 4)
    unchanged(setup, lambda: tree.insert([1, 2, 3], slots[:3]), PageAlignmentError, "page_size=2")
    scrambled = slots[[1, 0, 2, 3]]
    unchanged(setup, lambda: tree.insert([5, 5, 5, 5], scrambled), PageAlignmentError, "whole pages")
    unchanged(setup, lambda: tree.insert([5, 5], np.array([0, 1])), InvalidSlotsError, "reserved page 0")
    unchanged(setup, lambda: tree.insert([5, 5], np.array([2.0, 3.0])), InvalidSlotsError, "integers")


def test_unlocking_what_is_not_locked(setup: tuple) -> None:
    tree, _, req = setup
    other = tree.match_prefix([7, 8]).node
    unchanged(setup, lambda: tree.dec_lock_ref(other), LockError, "does not hold")
    unchanged(setup, lambda: tree.dec_lock_ref(req.last_node, 10**9), LockError, "not on the path")
    gone = tree.match_prefix([7, 8]).node
    tree.evict_subtree(gone)
    unchanged(setup, lambda: tree.dec_lock_ref(gone), LockError, "not in this tree")
    unchanged(setup, lambda: tree.inc_lock_ref(gone), LockError, "not in this tree")


def test_locking_a_window_that_holds_a_tombstone(setup: tuple) -> None:
    tree, _, _ = setup
    tomb = next(n for n in tree.iter_nodes() if n.tombstone)
    unchanged(setup, lambda: tree.inc_lock_ref(tomb), LockError, "tombstone")


def test_evicting_a_locked_path(setup: tuple) -> None:
    tree, _, req = setup
    unchanged(setup, lambda: tree.evict_subtree(req.last_node), EvictLockedError, "locked")
    unchanged(setup, lambda: tree.evict_subtree(tree.root), EvictLockedError, "locked")
    unchanged(setup, tree.reset, EvictLockedError, "release the live requests")


def test_keys_of_the_wrong_mode_or_namespace(setup: tuple) -> None:
    tree, _, _ = setup
    bigram = RadixKey.of([1, 2, 3], bigram=True)
    unchanged(setup, lambda: tree.match_prefix(bigram), ValueError, "eagle=False")
    key = RadixKey.of([1, 2], extra_key="a")
    unchanged(setup, lambda: tree.match_prefix(key, extra_key="b"), ExtraKeyMismatchError, "extra_key")


def test_request_state_errors(setup: tuple) -> None:
    tree, _, req = setup
    unchanged(setup, lambda: tree.admit(req, [1, 2, 3]), RequestStateError, "fresh request")
    # fewer tokens than the request already covers, or more than it holds slots for
    unchanged(setup, lambda: tree.cache_unfinished_req(req, [1, 2]), RequestStateError, "already covers")
    too_long = list(range(1, 20))
    unchanged(setup, lambda: tree.cache_finished_req(req, too_long), RequestStateError, "holds")


def test_constructor_arguments() -> None:
    alloc = CheckedSWAAllocator(16, 16, 2)
    with pytest.raises(ValueError, match="sliding_window"):
        SWARadixCache(alloc, sliding_window=0, page_size=2)
    with pytest.raises(ValueError, match="page_size"):
        SWARadixCache(alloc, sliding_window=4, page_size=1)
    tree = SWARadixCache(alloc, sliding_window=4, page_size=2)
    with pytest.raises(ValueError, match="prev_prefix_len"):
        tree.insert([1, 2], alloc.alloc(2), prev_prefix_len=-1)
