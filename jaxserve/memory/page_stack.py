"""A persistent LIFO stack of free page ids: O(k) push/pop, O(1) snapshots, every old snapshot checkable.

Units: page ids `1..num_pages` (page 0 is the reserved padding page and never enters the stack).

Storage (`FreePageStack`, shared and mutable, private to this module's functions) and snapshots (`top`,
`seen_writes`: two ints held by an immutable allocator state) are separate:
- `entries[0:top]` is a snapshot's free set; the top of the stack is the end, so a pop of k pages takes
  `entries[top-k:top]` (last pushed first) and writes nothing.
- A push of m pages writes `entries[top:top+m]` and counts as one *write* (serial `num_writes`).
- `pos_of[p]` is where page p was last written; with `entries` it answers "is p free in this snapshot" in
  O(1) per page (see `is_free`).

Why old snapshots stay valid: pops never write, and a push writes only at or above the pushing snapshot's
`top`. A snapshot (`top`, `seen_writes`) is valid exactly while no write made after it (serial >
`seen_writes`) started below its `top`. So a snapshot stays valid after any number of pops from it or its
descendants, and after pushes that start at or above its `top` (frees without allocations in between). A
push from a popped descendant writes below the snapshot's `top` and invalidates it; `check_valid` detects
that in O(log num_pages) via the suffix minima of write positions, and every operation calls it first.

Why `is_free` is exact for every valid snapshot (induction over writes; true initially): a push of
pages X by a valid snapshot r (X checked not free in r) writes `[r.top, r.top + m)`. A snapshot s that
stays valid has `s.top <= r.top`, and both see the current entries below their tops, so s's free set is
part of r's: X is not free in s, and the new `pos_of[X] >= r.top >= s.top` says so; other pages keep
their `pos_of`, and nothing below s.top changed. For the new snapshot, entries below r.top are r's, X sits
where `pos_of` says, and a page whose old position was overwritten reads as not free, as it should be.
"""

from __future__ import annotations

import numpy as np

from jaxserve.memory.errors import StaleAllocatorStateError

PAGE_DTYPE = np.int64


class SuffixMinLog:
    """Records values in time order; answers "the minimum of the values recorded after serial t".

    Keeps only the suffix minima (serials increasing, values strictly increasing), so it holds at most
    `capacity` entries for values in `[0, capacity)` (negated values: `(-capacity, 0]`). Record: amortised
    O(1); query: O(log capacity).
    """

    def __init__(self, capacity: int) -> None:
        self.num_records = 0
        self._serial = np.zeros(capacity + 1, dtype=np.int64)
        self._value = np.zeros(capacity + 1, dtype=np.int64)
        self._size = 0

    def record(self, value: int) -> int:
        """Append a value; returns its serial (1, 2, ...)."""
        self.num_records += 1
        n = self._size
        while n and self._value[n - 1] >= value:
            n -= 1
        self._serial[n] = self.num_records
        self._value[n] = value
        self._size = n + 1
        return self.num_records

    def min_after(self, serial: int, default: int) -> int:
        """The smallest value recorded with serial > `serial`, or `default` if none.

        O(1) when nothing was recorded after `serial` (the common case: the caller holds the latest state).
        """
        if serial >= self.num_records:
            return default
        i = int(self._serial[: self._size].searchsorted(serial, side="right"))
        return int(self._value[i]) if i < self._size else default


class FreePageStack:
    """The shared storage of one allocator lineage (all states derived from one `make_*` call)."""

    def __init__(self, num_pages: int) -> None:
        self.num_pages = num_pages
        # Initial order: page 1 on top, so the first pops hand out 1, 2, 3, ... (like cache.testing).
        self.entries = np.arange(num_pages, 0, -1, dtype=PAGE_DTYPE)
        self.pos_of = np.full(num_pages + 1, -1, dtype=PAGE_DTYPE)
        self.pos_of[self.entries] = np.arange(num_pages, dtype=PAGE_DTYPE)
        self.writes = SuffixMinLog(num_pages + 1)  # start position of every push

    @property
    def num_writes(self) -> int:
        return self.writes.num_records

    def lowest_write_after(self, serial: int) -> int:
        """The smallest start position of any write with serial > `serial` (num_pages + 1 if none)."""
        return self.writes.min_after(serial, self.num_pages + 1)


def check_valid(stack: FreePageStack, top: int, seen_writes: int) -> None:
    """Raise StaleAllocatorStateError if a later push overwrote part of this snapshot's free set.

    O(1) when no push happened after the snapshot, else O(log num_pages)."""
    if seen_writes < stack.writes.num_records and stack.lowest_write_after(seen_writes) < top:
        raise StaleAllocatorStateError(
            "this allocator state is stale: pages were freed from a state derived after it by allocation, "
            "overwriting its free list. Restore only states saved after the last free (no frees between "
            "backup and restore)."
        )


def is_free(stack: FreePageStack, top: int, pages: np.ndarray) -> np.ndarray:
    """Boolean per page: is it in the free set of the (valid) snapshot with this `top`. O(len(pages))."""
    pos = stack.pos_of[pages]
    # pos_of is in [0, num_pages) for pages 1..num_pages and -1 only for page 0, which `entries` never
    # holds: entries[-1] != 0, so page 0 reads as not free without a separate `pos >= 0` mask.
    return (pos < top) & (stack.entries[pos] == pages)


def any_free_few(stack: FreePageStack, top: int, pages: list[int]) -> bool:
    """`is_free(...).any()` for a few pages given as Python ints (1..num_pages), without numpy calls."""
    pos_of, entries = stack.pos_of, stack.entries
    for page in pages:
        pos = int(pos_of[page])
        if pos < top and int(entries[pos]) == page:
            return True
    return False


def push_few(stack: FreePageStack, top: int, pages: list[int]) -> tuple[int, int]:
    """`push` of a few pages given as Python ints (same rules, same writes), element by element."""
    entries, pos_of = stack.entries, stack.pos_of
    for pos, page in enumerate(pages, top):
        entries[pos] = page
        pos_of[page] = pos
    return top + len(pages), stack.writes.record(top)


def pop(stack: FreePageStack, top: int, num_pages: int) -> tuple[int, np.ndarray]:
    """Take `num_pages` pages (caller checked availability); returns (new top, pages in hand-out order)."""
    return top - num_pages, stack.entries[top - num_pages : top][::-1].copy()


def push(stack: FreePageStack, top: int, pages: np.ndarray) -> tuple[int, int]:
    """Write distinct pages that are not free in this snapshot; returns (new top, new seen_writes)."""
    new_top = top + pages.size
    stack.entries[top:new_top] = pages
    stack.pos_of[pages] = np.arange(top, new_top, dtype=PAGE_DTYPE)
    return new_top, stack.writes.record(top)
