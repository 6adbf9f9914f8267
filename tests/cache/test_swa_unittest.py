"""The unit tests PR #11231 added/extended in SGLang's `test/srt/test_swa_unittest.py`,
against our tree and `CheckedSWAAllocator`, with their exact asserted numbers."""

from __future__ import annotations

import numpy as np
import pytest

from cache import SWARadixCache
from cache.testing import CheckedSWAAllocator


def test_swa_memory_pool_alloc_takes_one_slot_per_side_and_free_swa_unmaps() -> None:
    alloc = CheckedSWAAllocator(16, 16)
    assert alloc.full_available_size() + alloc.swa_available_size() == 32
    index = alloc.alloc(1)
    assert alloc.full_available_size() + alloc.swa_available_size() == 30
    assert alloc.swa_slots_of(index)[0] != 0
    alloc.free_swa(index)
    assert alloc.swa_slots_of(index).tolist() == [0]
    assert alloc.swa_available_size() == 16
    alloc.free_swa(index)  # idempotent through the zeroed mapping
    alloc.free(index)  # frees the full slot only: no SWA slot is freed twice
    assert (alloc.full_available_size(), alloc.swa_available_size()) == (16, 16)


SEQS = ([1, 2, 3], [1, 2, 3, 4, 5, 6, 7], [10, 11, 12], [1, 2, 3, 4, 5, 60, 70])


@pytest.mark.parametrize(
    ("eagle", "prefix_lens", "matched", "last_key_tokens"),
    [
        (False, [0, 3, 0, 5], 7, [60, 70]),
        (True, [0, 2, 0, 4], 6, [5, 60, 70]),  # bigrams (5,60), (60,70) are stored as tokens [5, 60, 70]
    ],
)
def test_swa_radix_cache_pr_test(
    eagle: bool, prefix_lens: list[int], matched: int, last_key_tokens: list[int]
) -> None:
    """test_swa_radix_cache_1 / _eagle: kv 128, swa 64, P=1, W=4; four inserts with fresh slots, then
    evict(1, 0), evict(0, 1), evict(1, 2)."""
    alloc = CheckedSWAAllocator(128, 64)
    tree = SWARadixCache(alloc, sliding_window=4, eagle=eagle)
    got = []
    for seq in SEQS:
        slots = alloc.alloc(len(seq))
        assert len(slots) == len(seq)
        got.append(tree.insert(seq, slots))
        if eagle:  # R4: the slot of the last token is not stored; the caller frees it (upstream leaks it)
            alloc.free(slots[len(seq) - 1 :])
        tree.check_invariants()
    assert got == prefix_lens
    tree.evict(1, 0)
    tree.evict(0, 1)
    tree.evict(1, 2)
    tree.check_invariants()
    slots, _ = tree.match_prefix([1, 2, 3, 4, 5])
    assert slots.shape[0] == 0  # "no swa prefix matched"
    slots, node = tree.match_prefix([1, 2, 3, 4, 5, 60, 70])
    assert slots.shape[0] == matched
    assert node.key.tokens.tolist() == last_key_tokens
    assert node.key.bigram is eagle
    tree.check_invariants()


def test_swa_pr_test_eviction_steps_in_detail() -> None:
    """The three evictions of the PR test, step by step (non-EAGLE): the full phase takes the LRU leaf
    [10,11,12]; the SWA phase tombstones the root-side [1,2,3] (SWA only); the last call's full phase frees
    the leaf [6,7] and that already covers its SWA request."""
    alloc = CheckedSWAAllocator(128, 64)
    tree = SWARadixCache(alloc, sliding_window=4)
    for seq in SEQS:
        tree.insert(seq, alloc.alloc(len(seq)))
    assert tree.evict(1, 0) == (3, 3)
    assert tree.evict(0, 1) == (0, 3)
    (tomb,) = [n for n in tree.iter_nodes() if n.tombstone]
    assert tomb.key.tokens.tolist() == [1, 2, 3]
    assert alloc.swa_slots_of(tomb.value).tolist() == [0, 0, 0]
    assert tree.evict(1, 2) == (2, 2)
    assert sorted(n.key.tokens.tolist() for n in tree.iter_nodes()) == [[1, 2, 3], [4, 5], [60, 70]]
    assert (tree.total_size(), tree.total_swa_size()) == (7, 4)
    assert np.array_equal(np.sort(alloc.free_slot_ids()).shape, (128 - 7,))
