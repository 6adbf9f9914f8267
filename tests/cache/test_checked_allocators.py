"""The brute-force allocators in cache.testing behave like a set model: no slot handed out twice,
page-granular frees, SWA mapping released with the full slot, and every error leaves the state unchanged."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache.errors import DoubleFreeError
from cache.testing import CheckedAllocator, CheckedSWAAllocator


@settings(max_examples=60, deadline=None)
@given(
    page_size=st.sampled_from([1, 4]),
    ops=st.lists(st.tuples(st.booleans(), st.integers(1, 9)), max_size=40),
)
def test_checked_allocator_matches_set_model(page_size, ops):
    alloc = CheckedAllocator(32 * page_size, page_size)
    free_pages = set(range(1, 33))
    held: list[np.ndarray] = []
    for is_alloc, n in ops:
        if is_alloc:
            slots = alloc.alloc(n)
            need = -(-n // page_size)
            if need > len(free_pages):
                assert slots is None
                continue
            pages = set((slots // page_size).tolist())
            assert len(pages) == need and pages <= free_pages
            free_pages -= pages
            held.append(slots)
        elif held:
            slots = held.pop(n % len(held))
            alloc.free(slots)
            free_pages |= set((slots // page_size).tolist())
        assert alloc.available_size() == len(free_pages) * page_size
        assert set((alloc.free_slot_ids() // page_size).tolist()) == free_pages


def test_double_free_and_mixed_batches_leave_state_unchanged():
    alloc = CheckedSWAAllocator(8, 8, 1)
    slots = alloc.alloc(2)
    alloc.free(slots[:1])
    def snapshot():
        return alloc.full_available_size(), alloc.swa_available_size(), alloc.swa_slots_of(slots).tolist()

    before = snapshot()
    with pytest.raises(DoubleFreeError):
        alloc.free(slots)  # slots[0] is already free, slots[1] is not
    assert snapshot() == before
    with pytest.raises(ValueError):
        alloc.free(np.array([0]))  # slot 0 is the reserved padding slot


def test_swa_free_after_tombstone_frees_swa_once():
    alloc = CheckedSWAAllocator(8, 4, 1)
    slots = alloc.alloc(3)
    assert (alloc.swa_slots_of(slots) > 0).all()
    alloc.free_swa(slots[:2])  # tombstone: SWA side only
    assert alloc.swa_available_size() == 3 and alloc.full_available_size() == 5
    alloc.free(slots)  # full side of all three, SWA only for the one still mapped
    assert alloc.swa_available_size() == 4 and alloc.full_available_size() == 8
