"""Token (page_size 1) and paged (page_size > 1) slot allocators: immutable states, pure functions.

Units: a *page* is `page_size` consecutive slots; page p covers slots `[p * page_size, (p + 1) * page_size)`.
Pages `1..num_pages` are allocatable; page 0 (slots `[0, page_size)`) is the reserved padding target and is
never handed out nor freed. With page_size 1 pages and slots coincide (the token allocator).

Ownership: `alloc` moves pages from the free set to the caller, who must return every slot exactly once
with `free` (freeing any slot frees its whole page). Backup is keeping a state object; restore is using it
again. A restored state forgets the allocations made after it, so slots handed out in between are free
again. States stay valid across any number of allocations; a free made from a state derived after a
backup by allocation makes that backup stale (`StaleAllocatorStateError`), see `page_stack`.

Always checked, before anything is written (O(k) in the slots passed, plus O(log num_pages)): slot range,
page 0, double free (against the state's own free set), alloc of <= 0 slots, stale states.
Reuse order matches `cache.testing.CheckedAllocator` (LIFO on pages, initial order 1, 2, 3, ...), so the
two hand out identical slot ids for identical call sequences.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import jax
import numpy as np

from jaxserve.memory import page_stack
from jaxserve.memory.errors import (
    DoubleFreeError,
    InvalidAllocRequestError,
    OutOfSlots,
    SlotRangeError,
)
from jaxserve.memory.few_pages import few_pages_of_slots
from jaxserve.memory.page_stack import PAGE_DTYPE, FreePageStack

SLOT_DTYPE = np.int64


@dataclass(frozen=True)
class AllocatorState:
    """One immutable snapshot of a slot allocator. Leaves: `top` (free pages), `seen_writes`."""

    stack: FreePageStack
    page_size: int
    top: int
    seen_writes: int

    @property
    def num_pages(self) -> int:
        """Allocatable pages (page 0 excluded)."""
        return self.stack.num_pages

    @property
    def num_slots(self) -> int:
        """Allocatable slots, `num_pages * page_size`."""
        return self.stack.num_pages * self.page_size

    @property
    def slot_limit(self) -> int:
        """One past the largest slot id, `(num_pages + 1) * page_size`: the pool's `num_slots`."""
        return (self.stack.num_pages + 1) * self.page_size


jax.tree_util.register_dataclass(
    AllocatorState, data_fields=["top", "seen_writes"], meta_fields=["stack", "page_size"]
)


def make_allocator(num_pages: int, page_size: int = 1) -> AllocatorState:
    """A fresh allocator over pages `1..num_pages` of `page_size` slots each, all free."""
    if page_size < 1 or num_pages < 1:
        raise InvalidAllocRequestError(
            f"need num_pages >= 1 and page_size >= 1, got {num_pages=}, {page_size=}"
        )
    return AllocatorState(FreePageStack(num_pages), page_size, num_pages, 0)


def make_token_allocator(num_slots: int) -> AllocatorState:
    """A page_size-1 allocator over slots `1..num_slots`."""
    return make_allocator(num_slots, 1)


def available_size(state: AllocatorState) -> int:
    """Free slots (a multiple of page_size). O(1)."""
    return state.top * state.page_size


def check_state(state: AllocatorState) -> None:
    """Raise StaleAllocatorStateError if `state` can no longer be used (see module docstring). O(log N)."""
    page_stack.check_valid(state.stack, state.top, state.seen_writes)


_check = check_state


def pages_to_slots(pages: np.ndarray, page_size: int) -> np.ndarray:
    """Every slot of these pages, page-major."""
    if page_size == 1:
        return pages.astype(SLOT_DTYPE, copy=False)
    offsets = _OFFSETS.get(page_size)
    if offsets is None:
        offsets = _OFFSETS[page_size] = np.arange(page_size, dtype=SLOT_DTYPE)
    return (pages[:, None] * page_size + offsets).reshape(-1)


_OFFSETS: dict[int, np.ndarray] = {}  # page_size -> arange(page_size), the slot offsets within a page


def alloc_pages(state: AllocatorState, num_pages: int) -> tuple[AllocatorState, np.ndarray] | OutOfSlots:
    """Take `num_pages` free pages. Returns (new state, page ids) or OutOfSlots (state unchanged). O(k)."""
    if num_pages <= 0:
        raise InvalidAllocRequestError(f"alloc needs at least one page, got {num_pages}")
    _check(state)
    if num_pages > state.top:
        return OutOfSlots(num_pages, state.top)
    top, pages = page_stack.pop(state.stack, state.top, num_pages)
    return AllocatorState(state.stack, state.page_size, top, state.stack.num_writes), pages


def alloc(state: AllocatorState, num_slots: int) -> tuple[AllocatorState, np.ndarray] | OutOfSlots:
    """`ceil(num_slots / page_size)` fresh pages; returns their first `num_slots` slots, page-major.

    A partial last page is owned whole by the caller (freeing any of its slots frees it).
    """
    if num_slots <= 0:
        raise InvalidAllocRequestError(f"alloc needs num_slots >= 1, got {num_slots}")
    result = alloc_pages(state, -(-num_slots // state.page_size))
    if isinstance(result, OutOfSlots):
        return result
    new_state, pages = result
    return new_state, pages_to_slots(pages, state.page_size)[:num_slots]


def check_slot_range(state: AllocatorState, slots: np.ndarray) -> None:
    """Raise SlotRangeError unless every slot of this flat int array is in `[page_size, slot_limit)`."""
    if slots.size:
        lo, hi = state.page_size, (state.stack.num_pages + 1) * state.page_size
        if slots.min() < lo or slots.max() >= hi:
            bad = slots[(slots < lo) | (slots >= hi)][:5].tolist()
            raise SlotRangeError(
                f"slots {bad} are outside the allocatable range [{lo}, {hi}) "
                f"(page 0 = slots [0, {lo}) is the reserved padding page)"
            )


def pages_of_slots(state: AllocatorState, slots: np.ndarray) -> np.ndarray:
    """Validated, de-duplicated, sorted pages of these slots. Raises SlotRangeError / TypeError.

    Cost: O(1) numpy calls. With page_size > 1 the slots of one page usually come in a run (a node's value,
    a request's tail), so runs collapse to one page first and only the pages are sorted, not every slot."""
    arr = np.asarray(slots)
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError(f"slot ids must be integers, got dtype {arr.dtype}")
    arr = arr.astype(SLOT_DTYPE, copy=False).reshape(-1)
    if state.page_size == 1:
        check_slot_range(state, arr)
        return unique_sorted(arr)
    pages = arr // state.page_size
    if pages.size > 1:
        run_starts = pages[1:] != pages[:-1]
        pages = pages[np.concatenate(([True], run_starts))]
    if pages.size and (pages.min() < 1 or pages.max() > state.stack.num_pages):
        check_slot_range(state, arr)  # the range on pages is the range on slots; this raises the details
    return unique_sorted(pages)


def unique_sorted(values: np.ndarray) -> np.ndarray:
    """Sorted distinct values. Strictly ascending or descending input (the slots of one alloc come out one
    way or the other) needs no sort; np.unique's hashing path is slower for the small arrays of one call."""
    values = values.astype(PAGE_DTYPE, copy=False)
    if values.size < 2:
        return values
    if (values[1:] < values[:-1]).all():  # first: pages reused LIFO come out of an alloc descending
        return values[::-1]
    if (values[1:] > values[:-1]).all():
        return values
    values = np.sort(values)
    dup = values[1:] == values[:-1]
    if dup.any():
        values = values[np.concatenate(([True], ~dup))]
    return values


def check_not_free(state: AllocatorState, pages: np.ndarray) -> None:
    """Raise DoubleFreeError if any of these (valid, distinct) pages is already free in `state`."""
    already = page_stack.is_free(state.stack, state.top, pages)
    if already.any():
        raise DoubleFreeError(
            f"pages {pages[already][:5].tolist()} (page_size={state.page_size}) are already free; "
            "every slot must be freed exactly once"
        )


def free_pages(state: AllocatorState, pages: np.ndarray) -> AllocatorState:
    """Return distinct, in-range pages to the free set (LIFO: the last of them is handed out first)."""
    _check(state)
    if pages.size == 0:
        return state
    check_not_free(state, pages)
    return push_checked_pages(state, pages)


def push_checked_pages(state: AllocatorState, pages: np.ndarray) -> AllocatorState:
    """`free_pages` without its checks, for callers that already ran them on this state (valid state;
    distinct, in-range pages none of which is free). Empty input returns `state`."""
    if pages.size == 0:
        return state
    top, seen = page_stack.push(state.stack, state.top, pages)
    return AllocatorState(state.stack, state.page_size, top, seen)


def pop_checked_pages(state: AllocatorState, num_pages: int) -> tuple[AllocatorState, np.ndarray]:
    """`alloc_pages` without its checks, for callers that already checked the state and that
    `1 <= num_pages <= state.top`."""
    top, pages = page_stack.pop(state.stack, state.top, num_pages)
    return AllocatorState(state.stack, state.page_size, top, state.stack.num_writes), pages


def free(state: AllocatorState, slots: np.ndarray) -> AllocatorState:
    """Free these slots' pages (whole pages). Empty input returns `state`. O(k log k) in slots passed;
    a few slots (`few_pages.FEW_SLOTS`) take Python ints instead of numpy calls, same checks and errors."""
    few = few_pages_of_slots(slots, state.page_size, state.stack.num_pages)
    if few is None:
        return free_pages(state, pages_of_slots(state, slots))
    _check(state)
    check_few_not_free(state, few)
    return push_few_checked(state, few)


def check_few_not_free(state: AllocatorState, pages: list[int]) -> None:
    """`check_not_free` for distinct, in-range pages given as Python ints; raises the same error."""
    if page_stack.any_free_few(state.stack, state.top, pages):
        check_not_free(state, np.array(pages, dtype=PAGE_DTYPE))


def push_few_checked(state: AllocatorState, pages: list[int]) -> AllocatorState:
    """`push_checked_pages` for pages given as Python ints."""
    if not pages:
        return state
    top, seen = page_stack.push_few(state.stack, state.top, pages)
    return AllocatorState(state.stack, state.page_size, top, seen)


def free_groups(state: AllocatorState, groups: Sequence[np.ndarray]) -> AllocatorState:
    """Free several slot arrays as one batch (one write); raises if any page is freed twice across them."""
    arrays = [np.asarray(g).reshape(-1) for g in groups]
    if not arrays:
        return state
    pages_per_group = [pages_of_slots(state, a) for a in arrays]
    merged = np.concatenate(pages_per_group)
    pages = np.unique(merged)
    if pages.size != merged.size:
        values, counts = np.unique(merged, return_counts=True)
        raise DoubleFreeError(f"pages {values[counts > 1][:5].tolist()} appear in more than one free group")
    return free_pages(state, pages)


def is_slot_free(state: AllocatorState, slots: np.ndarray) -> np.ndarray:
    """Per slot: is its page free in this state. Raises SlotRangeError for out-of-range slots."""
    arr = np.asarray(slots, dtype=SLOT_DTYPE).reshape(-1)
    check_slot_range(state, arr)
    _check(state)
    return page_stack.is_free(state.stack, state.top, arr // state.page_size)


def free_slot_ids(state: AllocatorState) -> np.ndarray:
    """Every free slot id, ascending (debug/invariant checks; O(num free slots))."""
    _check(state)
    pages = np.sort(state.stack.entries[: state.top])
    return pages_to_slots(pages, state.page_size)
