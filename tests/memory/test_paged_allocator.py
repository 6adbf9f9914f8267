"""Token/paged allocators vs a brute-force set model: random op sequences incl. backup/restore and errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxserve.memory import allocator as A
from jaxserve.memory.errors import (
    DoubleFreeError,
    InvalidAllocRequestError,
    OutOfSlots,
    SlotRangeError,
    StaleAllocatorStateError,
)


def _pages(slots: np.ndarray, p: int) -> set[int]:
    return {int(s) // p for s in slots}


def _assert_matches(state: A.AllocatorState, free_pages: set[int]) -> None:
    p = state.page_size
    want = sorted(q * p + o for q in free_pages for o in range(p))
    assert A.free_slot_ids(state).tolist() == want
    assert A.available_size(state) == len(free_pages) * p


@settings(max_examples=60, deadline=None)
@given(num_pages=st.integers(1, 12), page_size=st.sampled_from([1, 2, 4]), data=st.data())
def test_alloc_free_backup_restore_match_set_model(num_pages: int, page_size: int, data) -> None:
    state = A.make_allocator(num_pages, page_size)
    free = set(range(1, num_pages + 1))  # the model: free page ids
    owned: list[np.ndarray] = []  # slot arrays handed out and not yet freed
    backups: list[tuple[A.AllocatorState, set[int], int]] = []  # (state, model, frees so far)
    num_frees = 0
    for _ in range(data.draw(st.integers(1, 25))):
        op = data.draw(st.sampled_from(["alloc", "free", "backup", "restore", "double", "range", "zero"]))
        if op == "alloc":
            n = data.draw(st.integers(1, (num_pages + 1) * page_size))
            result = A.alloc(state, n)
            need = -(-n // page_size)
            if need > len(free):
                assert isinstance(result, OutOfSlots) and not result
                assert result.requested_pages == need and result.free_pages == len(free)
            else:
                state, slots = result
                assert slots.size == n
                pages = _pages(slots, page_size)
                assert len(pages) == need and pages <= free  # fresh pages only: no slot handed out twice
                # page-major, consecutive within a page
                assert np.array_equal(slots % page_size, np.arange(n) % page_size)
                free -= pages
                owned.append(slots)
        elif op == "free" and owned:
            slots = owned.pop(data.draw(st.integers(0, len(owned) - 1)))
            sub = slots[data.draw(st.lists(st.integers(0, slots.size - 1), min_size=1, unique=True))]
            sub_pages = _pages(sub, page_size)
            state = A.free(state, sub)  # any slot of a page frees the whole page
            free |= sub_pages
            rest = slots[[int(s) // page_size not in sub_pages for s in slots]]
            if rest.size:
                owned.append(rest)
            num_frees += 1
        elif op == "backup":
            backups.append((state, set(free), num_frees))
        elif op == "restore" and backups:
            saved, saved_free, frees_then = backups[data.draw(st.integers(0, len(backups) - 1))]
            try:
                A.free_slot_ids(saved)
            except StaleAllocatorStateError:
                assert num_frees > frees_then, "a backup with no free after it must stay restorable"
                continue
            state, free = saved, set(saved_free)
            owned = [s for s in (o[[int(x) // page_size not in free for x in o]] for o in owned) if s.size]
            # slots allocated after the backup are free again; drop them from `owned`
        elif op == "double" and free:
            victim = data.draw(st.sampled_from(sorted(free)))
            with pytest.raises(DoubleFreeError):
                A.free(state, np.array([victim * page_size]))
        elif op == "range":
            bad = data.draw(st.sampled_from([0, page_size - 1, (num_pages + 1) * page_size, -1]))
            with pytest.raises(SlotRangeError):
                A.free(state, np.array([bad]))
        elif op == "zero":
            with pytest.raises(InvalidAllocRequestError):
                A.alloc(state, data.draw(st.integers(-3, 0)))
        _assert_matches(state, free)


def test_sglang_paged_example_lifo_page_reuse() -> None:
    """P=4, 4 pages: alloc(8) -> slots 4..11; free([9]) frees page 2; alloc(4) -> slots 8..11."""
    state = A.make_allocator(4, 4)
    state, slots = A.alloc(state, 8)
    assert slots.tolist() == list(range(4, 12))
    state = A.free(state, np.array([9]))
    assert A.available_size(state) == 12
    state, slots = A.alloc(state, 4)
    assert slots.tolist() == [8, 9, 10, 11]


def test_speculative_rollback_reuses_the_same_slots() -> None:
    """Backup, allocate draft slots, restore: the verify allocation gets the draft's slots back (E1)."""
    state = A.make_token_allocator(64)
    state, _ = A.alloc(state, 5)
    saved = state
    for _ in range(3):  # many speculative allocations after the backup
        state, _ = A.alloc(state, 4)
    state = saved
    assert A.available_size(state) == 59
    state, verify = A.alloc(state, 4)
    _, first_draft = A.alloc(saved, 4)
    assert verify.tolist() == first_draft.tolist()


def test_free_after_speculative_alloc_makes_the_backup_stale() -> None:
    state = A.make_token_allocator(16)
    saved = state
    state, slots = A.alloc(state, 3)
    state = A.free(state, slots[:1])  # overwrites the free-list entries the backup relies on
    with pytest.raises(StaleAllocatorStateError):
        A.alloc(saved, 1)
    with pytest.raises(StaleAllocatorStateError):
        A.free_slot_ids(saved)


def test_frees_without_allocs_keep_the_backup_valid() -> None:
    state = A.make_token_allocator(16)
    state, slots = A.alloc(state, 4)
    saved = state
    state = A.free(state, slots[:2])  # pushes above the backup's top: the backup is untouched
    assert A.free_slot_ids(saved).tolist() == list(range(5, 17))
    assert A.available_size(state) == 14


def test_errors_leave_the_state_unchanged() -> None:
    state = A.make_allocator(4, 2)
    state, slots = A.alloc(state, 3)
    before = A.free_slot_ids(state).tolist()
    for bad, exc in [
        (np.array([slots[0], 1]), SlotRangeError),  # one good slot, one on the padding page
        (np.array([slots[0], 10]), SlotRangeError),
        (np.array([slots[0], 8]), DoubleFreeError),  # slot 8 is on page 4, still free
        (np.array([1.5]), TypeError),
    ]:
        with pytest.raises(exc):
            A.free(state, bad)
        assert A.free_slot_ids(state).tolist() == before
    with pytest.raises(DoubleFreeError):
        A.free_groups(state, [slots[:1], slots[1:2]])  # slots 2 and 3 share page 1
    assert A.free_slot_ids(state).tolist() == before
    assert A.free(state, np.array([], dtype=np.int64)) is state


def test_free_groups_equals_sequential_frees() -> None:
    def three_allocs():
        s = A.make_allocator(8, 2)
        s, a = A.alloc(s, 4)
        s, b = A.alloc(s, 2)
        s, c = A.alloc(s, 6)
        return s, a, b, c

    s, a, b, c = three_allocs()
    grouped = A.free_groups(s, [a, c])
    s, a, b, c = three_allocs()  # a fresh lineage: `s` above is stale once `grouped` freed from it
    sequential = A.free(A.free(s, a), c)
    assert A.free_slot_ids(grouped).tolist() == A.free_slot_ids(sequential).tolist()
    assert not A.is_slot_free(grouped, b).any()


def test_state_is_a_pytree_with_count_leaves() -> None:
    import jax

    state = A.make_token_allocator(8)
    leaves, treedef = jax.tree_util.tree_flatten(state)
    assert leaves == [8, 0]
    assert jax.tree_util.tree_unflatten(treedef, leaves) == state
