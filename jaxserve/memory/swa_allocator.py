"""The hybrid (sliding-window) allocator: a full and an SWA allocator plus a page-level full->SWA mapping.

Units: callers speak *full* slots only. Every allocated full page p maps to one SWA page `mapping[p]`
(0 = none: never mapped, or its SWA side was freed); full slot s maps to SWA slot
`mapping[s // P] * P + s % P`. The host translates before a step (`swa_slots_of`); the device never sees
the mapping.

Ownership: `alloc` takes n full slots and n SWA slots; `free(full_slots)` frees the full pages and, through
the mapping, their SWA pages; `free_swa(full_slots)` frees only the SWA pages and zeroes the mapping, so a
later `free` of the same full slots frees no SWA page twice (SGLang's free-after-tombstone rule).

Validity of old states: the two sub-allocators follow `page_stack`'s rule. The mapping is one shared
array with two kinds of writes. An allocation from a state with full-stack top `hi` sets the entries of the
pages at full-stack positions `[hi - k, hi)`; that harms exactly the states that own those positions
(top < hi) and did not see the write, so a state is stale once any mapping write after it has `hi` above
its top (a backup followed by allocations and a restore stays valid; a sibling branch does not). A free
or `move_swa` rewrites entries that older states still need, so it makes every older state stale. This
enforces SGLang's rule that nothing is freed between backup and restore (`StaleAllocatorStateError`).
Checked always, before any write: ranges, double frees on either side, stale states.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import numpy as np

from jaxserve.memory import allocator as A
from jaxserve.memory import extend as E
from jaxserve.memory import page_stack
from jaxserve.memory.allocator import SLOT_DTYPE, AllocatorState
from jaxserve.memory.errors import (
    DoubleFreeError,
    InvalidAllocRequestError,
    OutOfSlots,
    StaleAllocatorStateError,
)
from jaxserve.memory.few_pages import few_pages_of_slots


class PageMapping:
    """Shared full-page -> SWA-page array of one SWA allocator lineage, plus a count of zeroing writes."""

    def __init__(self, num_full_pages: int) -> None:
        self.swa_page_of = np.zeros(num_full_pages + 1, dtype=SLOT_DTYPE)
        self.num_zeroings = 0
        self.alloc_writes = page_stack.SuffixMinLog(num_full_pages + 1)  # records -hi of every alloc


@dataclass(frozen=True)
class SWAAllocatorState:
    """An immutable snapshot: both sub-allocator states and the mapping zeroing count it has seen."""

    full: AllocatorState
    swa: AllocatorState
    mapping: PageMapping
    seen_zeroings: int
    seen_alloc_writes: int

    @property
    def page_size(self) -> int:
        return self.full.page_size


jax.tree_util.register_dataclass(
    SWAAllocatorState,
    data_fields=["full", "swa", "seen_zeroings", "seen_alloc_writes"],
    meta_fields=["mapping"],
)


def make_swa_allocator(num_full_pages: int, num_swa_pages: int, page_size: int = 1) -> SWAAllocatorState:
    """Full pages `1..num_full_pages` and SWA pages `1..num_swa_pages`, all free, nothing mapped."""
    return SWAAllocatorState(
        A.make_allocator(num_full_pages, page_size),
        A.make_allocator(num_swa_pages, page_size),
        PageMapping(num_full_pages),
        0,
        0,
    )


def check_state(state: SWAAllocatorState) -> None:
    """Raise StaleAllocatorStateError if `state` can no longer be used. O(log num_pages); O(1) when nothing
    was written after `state` (the latest state; `SuffixMinLog.min_after` answers at once)."""
    if state.mapping.num_zeroings != state.seen_zeroings:
        raise StaleAllocatorStateError(
            "this SWA allocator state is stale: slots were freed after it was saved (frees zero the shared "
            "full->SWA mapping). Restore only states saved after the last free."
        )
    if -state.mapping.alloc_writes.min_after(state.seen_alloc_writes, 0) > state.full.top:
        raise StaleAllocatorStateError(
            "this SWA allocator state is stale: a sibling branch (an allocation from an older state) "
            "remapped pages this state owns. Restore only states the latest one was allocated from."
        )
    page_stack.check_valid(state.full.stack, state.full.top, state.full.seen_writes)
    page_stack.check_valid(state.swa.stack, state.swa.top, state.swa.seen_writes)


def full_available_size(state: SWAAllocatorState) -> int:
    return A.available_size(state.full)


def swa_available_size(state: SWAAllocatorState) -> int:
    return A.available_size(state.swa)


def _out_of_slots(state: SWAAllocatorState, num_pages: int) -> OutOfSlots | None:
    if num_pages > state.full.top:
        return OutOfSlots(num_pages, state.full.top, "full")
    if num_pages > state.swa.top:
        return OutOfSlots(num_pages, state.swa.top, "swa")
    return None


def _take_mapped_pages(
    state: SWAAllocatorState, num_pages: int
) -> tuple[SWAAllocatorState, np.ndarray] | OutOfSlots:
    """`num_pages` (>= 1) full pages, each mapped to a fresh SWA page; returns the full pages. The caller
    has run `check_state(state)`."""
    short = _out_of_slots(state, num_pages)
    if short is not None:
        return short
    full, full_pages = A.pop_checked_pages(state.full, num_pages)
    swa, swa_pages = A.pop_checked_pages(state.swa, num_pages)
    state.mapping.swa_page_of[full_pages] = swa_pages
    seen = state.mapping.alloc_writes.record(-state.full.top)
    return SWAAllocatorState(full, swa, state.mapping, state.seen_zeroings, seen), full_pages


def alloc(state: SWAAllocatorState, num_slots: int) -> tuple[SWAAllocatorState, np.ndarray] | OutOfSlots:
    """n full slots (page-major), with n SWA slots mapped behind them; OutOfSlots if either side is short."""
    if num_slots <= 0:
        raise InvalidAllocRequestError(f"alloc needs num_slots >= 1, got {num_slots}")
    check_state(state)
    result = _take_mapped_pages(state, -(-num_slots // state.page_size))
    if isinstance(result, OutOfSlots):
        return result
    new_state, pages = result
    return new_state, A.pages_to_slots(pages, state.page_size)[:num_slots]


def alloc_extend(
    state: SWAAllocatorState, prefix_lens: np.ndarray, seq_lens: np.ndarray, last_locs: np.ndarray
) -> tuple[SWAAllocatorState, np.ndarray] | OutOfSlots:
    """`extend.alloc_extend` on the full side; every new full page gets a fresh SWA page.

    Slots continuing a partial page share that page's existing SWA page (0 if its SWA side was freed).
    """
    check_state(state)
    fresh = E.fresh_pages_of_one(state.full, prefix_lens, seq_lens, last_locs)
    if fresh is not None:  # one request starting on a page boundary: whole fresh pages, no plan
        num_pages, num_slots = fresh
        result = _take_mapped_pages(state, num_pages)
        if isinstance(result, OutOfSlots):
            return result
        new_state, pages = result
        return new_state, A.pages_to_slots(pages, state.page_size)[:num_slots]
    plan = E.plan_extend(state.full, prefix_lens, seq_lens, last_locs)
    new_state, pages = state, np.zeros(0, dtype=SLOT_DTYPE)
    if plan.num_new_pages:
        result = _take_mapped_pages(state, plan.num_new_pages)
        if isinstance(result, OutOfSlots):
            return result
        new_state, pages = result
    return new_state, E.slots_for_plan(plan, pages, state.page_size)


def alloc_decode(
    state: SWAAllocatorState, seq_lens: np.ndarray, last_locs: np.ndarray
) -> tuple[SWAAllocatorState, np.ndarray] | OutOfSlots:
    """`extend.alloc_decode` with SWA pages mapped behind new full pages."""
    seq = np.asarray(seq_lens, dtype=np.int64)
    return alloc_extend(state, seq - 1, seq, last_locs)


def _owned_full_pages(state: SWAAllocatorState, slots: np.ndarray) -> np.ndarray:
    pages = A.pages_of_slots(state.full, slots)
    A.check_not_free(state.full, pages)
    return pages


def _free_sides(state: SWAAllocatorState, full_pages: np.ndarray, free_full: bool) -> SWAAllocatorState:
    """Free `full_pages` (distinct, allocated in the checked `state`) and/or their SWA pages. Validates the
    SWA side before writing either side; the pushes then skip the checks already made."""
    swa_pages = state.mapping.swa_page_of[full_pages]
    swa_pages = swa_pages[swa_pages != 0]
    swa_pages.sort()
    if swa_pages.size > 1 and (swa_pages[1:] == swa_pages[:-1]).any():
        raise DoubleFreeError("two full pages map to one SWA page; the mapping is corrupt")
    if swa_pages.size:
        A.check_not_free(state.swa, swa_pages)  # validate both sides before writing either
    swa = A.push_checked_pages(state.swa, swa_pages)
    full = A.push_checked_pages(state.full, full_pages) if free_full else state.full
    state.mapping.swa_page_of[full_pages] = 0
    state.mapping.num_zeroings += 1
    m = state.mapping
    return SWAAllocatorState(full, swa, m, m.num_zeroings, m.alloc_writes.num_records)


def _free_few_sides(state: SWAAllocatorState, pages: list[int], free_full: bool) -> SWAAllocatorState:
    """`_owned_full_pages` then `_free_sides` for full pages from `few_pages_of_slots` (Python ints): the
    same checks in the same order, the same errors and writes."""
    A.check_few_not_free(state.full, pages)
    if not pages:
        return state
    m = state.mapping
    page_of = m.swa_page_of
    swa_pages = sorted(s for s in (int(page_of[p]) for p in pages) if s)
    if len(set(swa_pages)) != len(swa_pages):
        raise DoubleFreeError("two full pages map to one SWA page; the mapping is corrupt")
    A.check_few_not_free(state.swa, swa_pages)  # validate both sides before writing either
    swa = A.push_few_checked(state.swa, swa_pages)
    full = A.push_few_checked(state.full, pages) if free_full else state.full
    for p in pages:
        page_of[p] = 0
    m.num_zeroings += 1
    return SWAAllocatorState(full, swa, m, m.num_zeroings, m.alloc_writes.num_records)


def free(state: SWAAllocatorState, slots: np.ndarray) -> SWAAllocatorState:
    """Free these full slots' pages and their mapped SWA pages. Empty input returns `state`. A few slots
    (`few_pages.FEW_SLOTS`) take Python ints instead of numpy calls, same checks and errors."""
    check_state(state)
    few = few_pages_of_slots(slots, state.page_size, state.full.stack.num_pages)
    if few is not None:
        return _free_few_sides(state, few, free_full=True)
    pages = _owned_full_pages(state, slots)
    return _free_sides(state, pages, free_full=True) if pages.size else state


def free_swa(state: SWAAllocatorState, slots: np.ndarray) -> SWAAllocatorState:
    """Free only the SWA pages behind these (allocated) full slots and zero their mapping entries.

    Entries already zero are skipped, so repeating free_swa, or a later `free`, frees no SWA page twice.
    """
    check_state(state)
    few = few_pages_of_slots(slots, state.page_size, state.full.stack.num_pages)
    if few is not None:
        return _free_few_sides(state, few, free_full=False)
    pages = _owned_full_pages(state, slots)
    return _free_sides(state, pages, free_full=False) if pages.size else state


def _whole_pages(state: SWAAllocatorState, slots: np.ndarray, name: str) -> np.ndarray:
    p = state.page_size
    arr = np.asarray(slots).reshape(-1)
    A.pages_of_slots(state.full, arr)  # type and range checks
    rows = arr.astype(SLOT_DTYPE).reshape(-1, p) if arr.size % p == 0 else None
    if rows is None or (rows % p != np.arange(p)).any() or (rows // p != rows[:, :1] // p).any():
        raise InvalidAllocRequestError(f"move_swa: {name} must be whole pages in slot order (page_size={p})")
    return rows[:, 0] // p


def move_swa(state: SWAAllocatorState, from_slots: np.ndarray, to_slots: np.ndarray) -> SWAAllocatorState:
    """Re-point the SWA pages behind `from_slots` to `to_slots` (page by page) and unmap `from_slots`.

    Both must be whole allocated full pages in slot order, equal length, disjoint; every `from` page must
    map an SWA page and no `to` page may map one. Used to revive a tombstone: the node keeps its full slots
    and adopts the caller's fresh SWA KV; the caller then frees `from_slots` (full side only, now unmapped).
    Like a free, it rewrites mapping entries older states rely on, so they become stale.
    """
    check_state(state)
    src, dst = _whole_pages(state, from_slots, "from_slots"), _whole_pages(state, to_slots, "to_slots")
    both = np.concatenate([src, dst])
    if src.size != dst.size or np.unique(both).size != both.size:
        raise InvalidAllocRequestError("move_swa needs equal numbers of distinct, disjoint pages")
    if page_stack.is_free(state.full.stack, state.full.top, both).any():
        raise InvalidAllocRequestError("move_swa: every from/to page must be an allocated full page")
    m = state.mapping
    if (m.swa_page_of[src] == 0).any() or (m.swa_page_of[dst] != 0).any():
        raise InvalidAllocRequestError("move_swa: a from page maps no SWA page, or a to page maps one")
    m.swa_page_of[dst] = m.swa_page_of[src]
    m.swa_page_of[src] = 0
    m.num_zeroings += 1
    return SWAAllocatorState(state.full, state.swa, m, m.num_zeroings, m.alloc_writes.num_records)


def free_groups(state: SWAAllocatorState, groups: list[np.ndarray]) -> SWAAllocatorState:
    """Free several full-slot arrays as one batch; raises if a page appears in more than one group."""
    arrays = [np.asarray(g).reshape(-1) for g in groups]
    if not arrays:
        return state
    merged = np.concatenate([A.pages_of_slots(state.full, a) for a in arrays])
    if np.unique(merged).size != merged.size:
        raise DoubleFreeError("a page appears in more than one free group")
    return free(state, A.pages_to_slots(merged, state.page_size))


def swa_slots_of(state: SWAAllocatorState, slots: np.ndarray) -> np.ndarray:
    """The SWA slot of each full slot (same shape); 0 where none is mapped or the full page is not allocated.

    Raises SlotRangeError for a slot outside `[page_size, slot_limit)` and StaleAllocatorStateError for a
    stale state. One call for many slots costs about as much as one for a few (a handful of numpy ops), so
    batch: `KVCache.page_ids_many` maps every request of a step at once.
    """
    arr = np.asarray(slots, dtype=SLOT_DTYPE)
    flat = arr.reshape(-1)
    A.check_slot_range(state.full, flat)
    check_state(state)
    p = state.page_size
    pages = flat // p if p > 1 else flat
    swa_pages = state.mapping.swa_page_of[pages]  # a fresh array (fancy indexing)
    swa_pages[page_stack.is_free(state.full.stack, state.full.top, pages)] = 0
    if p == 1:
        return swa_pages.reshape(arr.shape)
    out = swa_pages * p + flat % p
    out[swa_pages == 0] = 0
    return out.reshape(arr.shape)


def free_slot_ids(state: SWAAllocatorState) -> np.ndarray:
    """Every free full slot id (debug/invariant checks)."""
    check_state(state)
    return A.free_slot_ids(state.full)


def free_swa_slot_ids(state: SWAAllocatorState) -> np.ndarray:
    """Every free SWA slot id (debug/invariant checks)."""
    check_state(state)
    return A.free_slot_ids(state.swa)
