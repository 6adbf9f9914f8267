"""The allocators' fast paths answer exactly like the general rules they shortcut, and every check still
raises: `SuffixMinLog.min_after` (O(1) when nothing was recorded later), `page_stack.is_free` (page 0),
`swa_slots_of` on restored states, the page_size-1 and decode shortcuts of `extend.slots_for_plan`, the
single-request whole-page shortcut of both `alloc_extend`s (`extend.fresh_pages_of_one`), and the SWA `free`
that validates once and pushes unchecked."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxserve.memory import allocator as A
from jaxserve.memory import extend as E
from jaxserve.memory import page_stack
from jaxserve.memory import swa_allocator as S
from jaxserve.memory.errors import DoubleFreeError, OutOfSlots, SlotRangeError, StaleAllocatorStateError


@settings(max_examples=100, deadline=None)
@given(values=st.lists(st.integers(-20, 0), max_size=30), data=st.data())
def test_min_after_matches_brute_force(values: list[int], data) -> None:
    log = page_stack.SuffixMinLog(21)
    for v in values:
        log.record(v)
    for serial in range(len(values) + 3):
        later = values[serial:]  # serials are 1-based: serial s is values[s - 1]
        assert log.min_after(serial, 99) == (min(later) if later else 99)


def test_page_zero_is_never_free() -> None:
    stack = page_stack.FreePageStack(4)
    for top in range(5):
        assert page_stack.is_free(stack, top, np.array([0])).tolist() == [False]
    assert page_stack.is_free(stack, 4, np.array([0, 1, 2, 3, 4])).tolist() == [False] + [True] * 4
    assert page_stack.is_free(stack, 2, np.array([1, 2, 3, 4])).tolist() == [False, False, True, True]


def _reference_swa_slots_of(state: S.SWAAllocatorState, slots: np.ndarray) -> np.ndarray:
    """The rule from first principles: the mapped SWA slot if the full page is allocated, else 0."""
    p = state.page_size
    free_pages = set((A.free_slot_ids(state.full) // p).tolist())
    out = []
    for s in slots.tolist():
        q = int(state.mapping.swa_page_of[s // p])
        out.append(q * p + s % p if q and s // p not in free_pages else 0)
    return np.array(out)


@pytest.mark.parametrize("page_size", [1, 4])
def test_swa_slots_of_on_a_restored_state_reads_zero_for_pages_allocated_after_it(page_size: int) -> None:
    p = page_size
    state = S.make_swa_allocator(8, 8, p)
    state, kept = S.alloc(state, 3 * p)
    backup = state
    state, later = S.alloc(state, 2 * p)  # mapped in the shared array, but free again in `backup`
    every = np.arange(p, 9 * p)
    assert np.array_equal(S.swa_slots_of(state, every), _reference_swa_slots_of(state, every))
    assert (S.swa_slots_of(state, later) > 0).all()
    assert (S.swa_slots_of(backup, later) == 0).all()
    assert np.array_equal(S.swa_slots_of(backup, every), _reference_swa_slots_of(backup, every))
    assert S.swa_slots_of(backup, kept.reshape(-1, p)).shape == (3, p)  # shape kept
    for bad in (np.array([0]), np.array([9 * p])):
        with pytest.raises(SlotRangeError):
            S.swa_slots_of(backup, bad)
    state = S.free(state, later)
    with pytest.raises(StaleAllocatorStateError):
        S.swa_slots_of(backup, kept)


@settings(max_examples=60, deadline=None)
@given(page_size=st.sampled_from([1, 2, 4]), data=st.data())
def test_decode_and_token_shortcuts_match_the_general_rule(page_size: int, data) -> None:
    p = page_size
    n = data.draw(st.integers(1, 6))
    pre = np.array(data.draw(st.lists(st.integers(0, 12), min_size=n, max_size=n)))
    step = (
        1
        if data.draw(st.booleans())
        else np.array(data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)))
    )
    seq = pre + step
    if (seq - pre).sum() == 0:
        seq[0] += 1
    state = A.make_allocator(64, p)
    # last_locs: the slot of position pre - 1 on some owned page with the right offset
    state, owned = A.alloc(state, n * p)
    last = np.where(pre % p != 0, owned[::p][:n] + (pre - 1) % p, 0)
    plan = E.plan_extend(state, pre, seq, last)
    pages = np.arange(20, 20 + plan.num_new_pages)
    got = E.slots_for_plan(plan, pages, p)
    expect, k = [], 0  # the rule, position by position
    for i in range(n):
        for pos in range(pre[i], seq[i]):
            if pos % p and pos - 1 >= pre[i]:
                expect.append(expect[-1] + 1)
            elif pos % p:
                expect.append(int(last[i]) + 1)
            else:
                expect.append(int(pages[k]) * p)
                k += 1
    assert got.tolist() == expect and k == pages.size


def test_swa_free_checks_both_sides_once_and_still_raises() -> None:
    state = S.make_swa_allocator(6, 6, 2)
    state, a = S.alloc(state, 4)
    state, b = S.alloc(state, 2)
    freed = S.free(state, a)
    with pytest.raises(DoubleFreeError):
        S.free(freed, a[:1])
    with pytest.raises(StaleAllocatorStateError):
        S.free(state, b)  # `state` is older than the free
    with pytest.raises(TypeError):
        S.free(freed, b.astype(float))
    # a corrupt mapping (two full pages behind one SWA page) raises before either side is written
    state = S.make_swa_allocator(6, 6, 2)
    state, a = S.alloc(state, 4)
    pages = np.unique(a // 2)
    state.mapping.swa_page_of[pages] = state.mapping.swa_page_of[pages[0]]
    full_writes, swa_writes = state.full.stack.num_writes, state.swa.stack.num_writes
    with pytest.raises(DoubleFreeError, match="mapping is corrupt"):
        S.free(state, a)
    assert (state.full.stack.num_writes, state.swa.stack.num_writes) == (full_writes, swa_writes)
    assert state.mapping.num_zeroings == state.seen_zeroings  # the mapping was not zeroed either


def _planned_extend(state, pre, seq, last, swa: bool):
    """`alloc_extend` through the plan only (the general rule the single-request shortcut skips)."""
    full = state.full if swa else state
    plan = E.plan_extend(full, pre, seq, last)
    new_state, pages = state, np.zeros(0, dtype=np.int64)
    if plan.num_new_pages:
        result = (
            S._take_mapped_pages(state, plan.num_new_pages)
            if swa
            else A.alloc_pages(state, plan.num_new_pages)
        )
        if isinstance(result, OutOfSlots):
            return result
        new_state, pages = result
    return new_state, E.slots_for_plan(plan, pages, full.page_size)


@settings(max_examples=150, deadline=None)
@given(
    page_size=st.sampled_from([1, 2, 4]),
    swa=st.booleans(),
    held=st.integers(0, 6),
    start=st.integers(-2, 14),
    length=st.integers(-1, 30),
    last_form=st.sampled_from(["one", "two", "list", "float"]),
    dtype=st.sampled_from([np.int64, np.int32]),
)
def test_single_request_extend_equals_the_plan(page_size, swa, held, start, length, last_form, dtype) -> None:
    """One request on a page boundary takes whole fresh pages without a plan: same slots, same state, same
    OutOfSlots and the same errors as the planned path, for any argument shapes and dtypes."""

    def fresh():
        state = S.make_swa_allocator(8, 8, page_size) if swa else A.make_allocator(8, page_size)
        if held:
            state, _ = (S.alloc if swa else A.alloc)(state, held * page_size)
        return state

    pre, seq = np.array([start], dtype=dtype), np.array([start + length], dtype=dtype)
    prev_slot = start + page_size if start > 0 else 0
    last = {"one": np.array([prev_slot]), "two": np.array([prev_slot, 0]), "list": [prev_slot],
            "float": np.array([float(prev_slot)])}[last_form]  # fmt: skip
    outcomes = []
    for fn in ((S.alloc_extend if swa else E.alloc_extend), lambda *a: _planned_extend(*a, swa=swa)):
        try:
            got = fn(fresh(), pre, seq, last)
        except Exception as exc:  # both paths must raise alike
            outcomes.append((type(exc), str(exc)))
            continue
        if isinstance(got, OutOfSlots):
            outcomes.append(("out", got))
        else:
            new_state, slots = got
            full = new_state.full if swa else new_state
            outcomes.append((slots.tolist(), full.top, full.stack.entries[: full.top].tolist()))
    assert outcomes[0] == outcomes[1]
