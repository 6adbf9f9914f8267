"""Frees of a few slots run on Python ints (`few_pages`): on random alloc/free sequences, including double
frees, duplicates in one call, out-of-range slots, page 0, non-integer and 2-D input and frees from stale
states, `allocator.free`, `swa_allocator.free` and `swa_allocator.free_swa` answer exactly like the
vectorised path they shortcut: the same free sets and reuse order, the same errors with the same messages."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxserve.memory import allocator as A
from jaxserve.memory import swa_allocator as S
from jaxserve.memory.few_pages import FEW_SLOTS, few_pages_of_slots

NUM_PAGES = 12


def vectorised_free(state: A.AllocatorState, slots) -> A.AllocatorState:
    return A.free_pages(state, A.pages_of_slots(state, slots))


def vectorised_swa_free(state: S.SWAAllocatorState, slots, free_full: bool) -> S.SWAAllocatorState:
    S.check_state(state)
    pages = S._owned_full_pages(state, slots)
    return S._free_sides(state, pages, free_full=free_full) if pages.size else state


def outcome(fn, *args):
    """`fn(*args)` as (result, None), or (None, (error type, message)) when it raises."""
    try:
        return fn(*args), None
    except Exception as exc:  # the comparison is the point: any error must match the other path's
        return None, (type(exc), str(exc))


def free_set(state) -> tuple:
    if isinstance(state, S.SWAAllocatorState):
        return free_set(state.full), free_set(state.swa), state.mapping.swa_page_of.tolist()
    return state.top, state.stack.entries[: state.top].tolist()


def slot_choice(data, page_size: int, held: list[int]):
    """Slots to free: mostly slots the caller holds (some twice), sometimes freed or foreign ones, in odd
    shapes and dtypes now and then."""
    limit = (NUM_PAGES + 1) * page_size
    pool = held + list(range(-1, limit + 2))
    chosen = data.draw(
        st.lists(
            st.sampled_from(pool) if held and data.draw(st.booleans()) else st.integers(-1, limit + 1),
            max_size=FEW_SLOTS + 4,
        )
    )
    form = data.draw(st.sampled_from(["int64", "int64", "int32", "uint16", "float", "2d", "list"]))
    if form == "list":
        return chosen
    if form == "float":
        return np.array(chosen, dtype=np.float64)
    if form == "2d":
        return np.array(chosen, dtype=np.int64).reshape(1, -1)
    if form == "uint16":
        return np.array([c for c in chosen if c >= 0], dtype=np.uint16)
    return np.array(chosen, dtype=form)


@settings(max_examples=200, deadline=None)
@given(page_size=st.sampled_from([1, 3, 4]), swa=st.booleans(), data=st.data())
def test_few_slot_frees_equal_the_vectorised_path(page_size: int, swa: bool, data) -> None:
    if swa:
        fast = [S.make_swa_allocator(NUM_PAGES, NUM_PAGES, page_size)]
        slow = [S.make_swa_allocator(NUM_PAGES, NUM_PAGES, page_size)]
        alloc = S.alloc
    else:
        fast, slow = [A.make_allocator(NUM_PAGES, page_size)], [A.make_allocator(NUM_PAGES, page_size)]
        alloc = A.alloc
    held: list[int] = []
    for _ in range(data.draw(st.integers(1, 12))):
        i = data.draw(st.integers(0, len(fast) - 1)) if data.draw(st.integers(0, 4)) == 0 else len(fast) - 1
        if data.draw(st.booleans()):
            n = data.draw(st.integers(1, 3 * page_size))
            got_fast, got_slow = outcome(alloc, fast[i], n), outcome(alloc, slow[i], n)
            assert (got_fast[1], type(got_fast[0])) == (got_slow[1], type(got_slow[0]))
            if isinstance(got_fast[0], tuple):
                (state_fast, slots), (state_slow, _) = got_fast[0], got_slow[0]
                fast.append(state_fast)
                slow.append(state_slow)
                held += slots.tolist()
            continue
        slots = slot_choice(data, page_size, held)
        free_full = not (swa and data.draw(st.booleans()))
        if swa:
            public = S.free if free_full else S.free_swa
            got_fast = outcome(public, fast[i], slots)
            got_slow = outcome(vectorised_swa_free, slow[i], slots, free_full)
        else:
            got_fast = outcome(A.free, fast[i], slots)
            got_slow = outcome(vectorised_free, slow[i], slots)
        assert got_fast[1] == got_slow[1]
        if got_fast[0] is not None:
            assert free_set(got_fast[0]) == free_set(got_slow[0])
            fast.append(got_fast[0])
            slow.append(got_slow[0])


def test_few_pages_answers_only_for_short_valid_integer_arrays() -> None:
    assert few_pages_of_slots(np.array([9, 4, 5, 9]), 4, 3) == [1, 2]
    assert few_pages_of_slots(np.array([], dtype=np.int64), 4, 3) == []
    assert few_pages_of_slots(np.array([3]), 4, 3) is None  # page 0
    assert few_pages_of_slots(np.array([16]), 4, 3) is None  # past the last page
    assert few_pages_of_slots(np.array([4.0]), 4, 3) is None
    assert few_pages_of_slots([4, 5], 4, 3) is None
    assert few_pages_of_slots(np.arange(4, 4 + FEW_SLOTS + 1), 1, 100) is None
