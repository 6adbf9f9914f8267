"""The facades behave exactly like cache.testing's brute-force CheckedAllocator / CheckedSWAAllocator."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache.allocator import SlotAllocator, SWASlotAllocator
from cache.errors import DoubleFreeError
from cache.testing import CheckedAllocator, CheckedSWAAllocator
from jaxserve.memory import (
    AllocatorFacade,
    StaleAllocatorStateError,
    SWAAllocatorFacade,
    make_allocator,
    make_swa_allocator,
)


def _same_error(fn_a, fn_b) -> None:
    """Both raise an exception of the same family (DoubleFreeError or ValueError), or both return equal."""
    results = []
    for fn in (fn_a, fn_b):
        try:
            results.append(("ok", fn()))
        except DoubleFreeError:
            results.append(("double", None))
        except ValueError:
            results.append(("value", None))
    (ka, ra), (kb, rb) = results
    assert ka == kb
    if ka == "ok":
        assert (ra is None and rb is None) or np.array_equal(ra, rb)


@settings(max_examples=50, deadline=None)
@given(num_pages=st.integers(1, 10), page_size=st.sampled_from([1, 2, 4]), data=st.data())
def test_facade_matches_checked_allocator(num_pages: int, page_size: int, data) -> None:
    ours = AllocatorFacade(make_allocator(num_pages, page_size))
    ref = CheckedAllocator(num_pages * page_size, page_size)
    assert isinstance(ours, SlotAllocator)
    limit = (num_pages + 1) * page_size
    handed: list[np.ndarray] = []
    for _ in range(data.draw(st.integers(1, 30))):
        op = data.draw(st.sampled_from(["alloc", "free", "free_any", "group"]))
        if op == "alloc":
            n = data.draw(st.integers(-1, 2 * page_size + 1))
            a: list = []
            b: list = []
            _same_error(lambda n=n, a=a: a.append(ours.alloc(n)), lambda n=n, b=b: b.append(ref.alloc(n)))
            if a and b:
                assert (a[0] is None) == (b[0] is None)
                if a[0] is not None:
                    assert np.array_equal(a[0], b[0])
                    handed.append(a[0])
        elif op == "free" and handed:
            slots = handed.pop(data.draw(st.integers(0, len(handed) - 1)))
            _same_error(lambda s=slots: ours.free(s), lambda s=slots: ref.free(s))
        elif op == "free_any":  # may be a double free, out of range or the padding page
            slots = np.array(data.draw(st.lists(st.integers(-1, limit), min_size=1, max_size=3)))
            _same_error(lambda s=slots: ours.free(s), lambda s=slots: ref.free(s))
        elif op == "group" and len(handed) >= 2:
            g1, g2 = handed.pop(), handed.pop()
            ours.free_group_begin()
            ours.free(g1)
            ours.free(g2)
            assert ours.available_size() == ref.available_size()  # pending frees not counted yet
            ours.free_group_end()
            ref.free(np.concatenate([g1, g2]))  # a group is one free of everything collected
        assert ours.available_size() == ref.available_size()
        assert np.array_equal(ours.free_slot_ids(), ref.free_slot_ids())
        handed = [h for h in (h[~np.isin(h, ref.free_slot_ids())] for h in handed) if h.size]


@settings(max_examples=40, deadline=None)
@given(
    num_full=st.integers(1, 8),
    num_swa=st.integers(1, 8),
    page_size=st.sampled_from([1, 2, 4]),
    data=st.data(),
)
def test_swa_facade_matches_checked_swa_allocator(num_full: int, num_swa: int, page_size: int, data) -> None:
    ours = SWAAllocatorFacade(make_swa_allocator(num_full, num_swa, page_size))
    ref = CheckedSWAAllocator(num_full * page_size, num_swa * page_size, page_size)
    assert isinstance(ours, SWASlotAllocator)
    handed: list[np.ndarray] = []
    for _ in range(data.draw(st.integers(1, 30))):
        op = data.draw(st.sampled_from(["alloc", "free", "free_swa", "free_any", "revive"]))
        if op == "alloc":
            n = data.draw(st.integers(1, 2 * page_size + 1))
            a, b = ours.alloc(n), ref.alloc(n)
            assert (a is None) == (b is None)
            if a is not None:
                assert np.array_equal(a, b)
                assert np.array_equal(ours.swa_slots_of(a), ref.swa_slots_of(b))
                handed.append(a)
        elif op == "free" and handed:
            slots = handed.pop(data.draw(st.integers(0, len(handed) - 1)))
            _same_error(lambda s=slots: ours.free(s), lambda s=slots: ref.free(s))
        elif op == "free_swa" and handed:
            slots = handed[data.draw(st.integers(0, len(handed) - 1))]
            ours.free_swa(slots)
            ref.free_swa(slots)
            assert np.array_equal(ours.swa_slots_of(slots), ref.swa_slots_of(slots))
        elif op == "revive" and handed and handed[-1].size >= page_size:
            old = handed[-1][: handed[-1].size // page_size * page_size]  # whole pages
            fresh = ours.alloc(old.size)
            assert (fresh is None) == (ref.alloc(old.size) is None)
            if fresh is None:
                continue
            ours.free_swa(old)
            ref.free_swa(old)
            ours.move_swa(fresh, old)
            ref.move_swa(fresh, old)
            assert np.array_equal(ours.swa_slots_of(old), ref.swa_slots_of(old))
            ours.free(fresh)  # full side only: its SWA pages now belong to `old`
            ref.free(fresh)
        elif op == "free_any":
            # Only all-free or all-out-of-range slots: on a *mixed* batch CheckedSWAAllocator frees the SWA
            # side before its full side raises (its state changes; ours does not), so they would diverge.
            pool = ref.free_slot_ids().tolist() or [0]
            bad = [0, (num_full + 1) * page_size]
            slots = np.array(
                data.draw(st.lists(st.sampled_from(pool if data.draw(st.booleans()) else bad), min_size=1))
            )
            _same_error(lambda s=slots: ours.free(s), lambda s=slots: ref.free(s))
        assert ours.full_available_size() == ref.full_available_size()
        assert ours.swa_available_size() == ref.swa_available_size()
        assert np.array_equal(ours.free_slot_ids(), ref.free_slot_ids())
        assert np.array_equal(ours.free_swa_slot_ids(), ref.free_swa_slot_ids())
        handed = [h for h in (h[~np.isin(h, ref.free_slot_ids())] for h in handed) if h.size]


def test_swa_facade_errors_change_nothing() -> None:
    """A mixed batch (one owned slot, one free slot) raises before either side changes; so does move_swa."""
    facade = SWAAllocatorFacade(make_swa_allocator(4, 4, 2))
    owned, other = facade.alloc(2), facade.alloc(2)
    before = (facade.free_slot_ids().tolist(), facade.free_swa_slot_ids().tolist())
    with pytest.raises(DoubleFreeError):
        facade.free(np.array([owned[0], 7]))  # slot 7 is on page 3, still free
    with pytest.raises(ValueError):
        facade.move_swa(owned, other)  # `other` still maps an SWA page
    with pytest.raises(ValueError):
        facade.move_swa(owned[:1], other[:1])  # not whole pages
    assert (facade.free_slot_ids().tolist(), facade.free_swa_slot_ids().tolist()) == before
    assert facade.swa_slots_of(owned).tolist() == [2, 3] and facade.swa_slots_of(other).tolist() == [4, 5]


def test_facade_backup_restore_and_free_group_errors() -> None:
    facade = AllocatorFacade(make_allocator(8, 1))
    kept = facade.alloc(2)
    saved = facade.state
    facade.alloc(5)
    assert facade.alloc(2) is None and facade.last_out_of_slots.free_pages == 1
    facade.state = saved
    assert facade.available_size() == 6
    facade.free_group_begin()
    facade.free(kept)
    with pytest.raises(ValueError):
        facade.state = saved  # no restore while frees are pending
    with pytest.raises(DoubleFreeError):
        facade.free(np.array([8]))  # already free: refused at once, the group keeps its valid frees
    facade.free_group_end()
    assert facade.available_size() == 8
    facade.free_group_begin()
    kept = facade.alloc(2)
    facade.free(kept)
    facade.free(kept[:1])  # the same page twice in one group: found at free_group_end
    with pytest.raises(DoubleFreeError):
        facade.free_group_end()
    assert facade.available_size() == 6  # the group was closed and nothing of it freed
    with pytest.raises(ValueError):
        facade.free_group_end()


def test_facade_restore_of_a_stale_state_raises_at_once() -> None:
    facade = SWAAllocatorFacade(make_swa_allocator(8, 8, 1))
    saved = facade.state
    facade.free(facade.alloc(3))  # a free after the backup
    with pytest.raises(StaleAllocatorStateError):
        facade.state = saved
    assert facade.full_available_size() == 8  # the current state is kept
    plain = AllocatorFacade(make_allocator(8, 1))
    saved = plain.state
    plain.free(plain.alloc(3)[:1])  # alloc then free from the descendant overwrites the backup's entries
    with pytest.raises(StaleAllocatorStateError):
        plain.state = saved
