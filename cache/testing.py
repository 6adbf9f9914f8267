"""Brute-force allocators for tests and benchmarks of the cache: vectorised, page-granular, and loud.

They implement `cache.allocator.SlotAllocator` / `SWASlotAllocator` with numpy free stacks (O(k) per call, no
Python loop over slots) and a per-page `is_free` bitmap that turns any double free, or free of slot 0 /
an out-of-range slot, into a DoubleFreeError / ValueError raised *before* any state changes.
"""

from __future__ import annotations

import numpy as np

from cache.errors import DoubleFreeError, OutOfSlotsError
from cache.keys import SLOT_DTYPE


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    """`np.unique` for int arrays via one sort (numpy 2.4's hash-based unique is ~10x slower at 1k items)."""
    values = np.sort(values)
    keep = np.empty(values.shape[0], dtype=bool)
    keep[:1] = True
    np.not_equal(values[1:], values[:-1], out=keep[1:])
    return values[keep]


class CheckedAllocator:
    """Pages `1..num_pages` of `page_size` slots each (page 0 reserved); LIFO reuse of freed pages."""

    def __init__(self, num_slots: int, page_size: int = 1) -> None:
        if page_size < 1 or num_slots < page_size:
            raise ValueError(f"need page_size >= 1 and num_slots >= page_size, got {num_slots=} {page_size=}")
        self._page_size = page_size
        self.num_pages = num_slots // page_size
        self.reset()

    @property
    def page_size(self) -> int:
        return self._page_size

    @property
    def num_slots(self) -> int:
        return self.num_pages * self._page_size

    def reset(self) -> None:
        self._stack = np.arange(self.num_pages, 0, -1, dtype=SLOT_DTYPE)  # top = end = page 1
        self._top = self.num_pages
        self._is_free = np.ones(self.num_pages + 1, dtype=bool)
        self._is_free[0] = False

    def available_size(self) -> int:
        """Free slots (a multiple of page_size)."""
        return self._top * self._page_size

    def alloc(self, num_slots: int) -> np.ndarray | None:
        """Slots of `ceil(num_slots / page_size)` fresh pages, page-major; None if there are not enough."""
        if num_slots <= 0:
            raise ValueError(f"alloc needs num_slots >= 1, got {num_slots}")
        num_pages = -(-num_slots // self._page_size)
        if num_pages > self._top:
            return None
        pages = self._stack[self._top - num_pages : self._top][::-1].copy()
        self._top -= num_pages
        self._is_free[pages] = False
        slots = (pages[:, None] * self._page_size + np.arange(self._page_size)).reshape(-1)
        return slots[:num_slots] if num_slots % self._page_size else slots

    def alloc_or_raise(self, num_slots: int) -> np.ndarray:
        slots = self.alloc(num_slots)
        if slots is None:
            raise OutOfSlotsError(f"need {num_slots} slots, {self.available_size()} free")
        return slots

    def _pages_of(self, slots: np.ndarray) -> np.ndarray:
        slots = np.asarray(slots, dtype=SLOT_DTYPE).reshape(-1)
        end = (self.num_pages + 1) * self._page_size
        if slots.size and (slots.min() < self._page_size or slots.max() >= end):
            raise ValueError(f"slot out of range 1..{(self.num_pages + 1) * self._page_size - 1} (or page 0)")
        return _sorted_unique(slots // self._page_size if self._page_size > 1 else slots)

    def free(self, slots: np.ndarray) -> None:
        pages = self._pages_of(slots)
        if pages.size == 0:
            return
        if self._is_free[pages].any():
            bad = pages[self._is_free[pages]][:5].tolist()
            raise DoubleFreeError(f"pages {bad} (page_size={self._page_size}) are already free")
        self._is_free[pages] = True
        self._stack[self._top : self._top + pages.size] = pages
        self._top += pages.size

    def free_slot_ids(self) -> np.ndarray:
        pages = np.flatnonzero(self._is_free)
        return (pages[:, None] * self._page_size + np.arange(self._page_size)).reshape(-1)


class CheckedSWAAllocator:
    """A full and an SWA `CheckedAllocator` plus a per-page full->SWA mapping (0 = unmapped).

    `alloc(n)` takes n full slots and n SWA slots and returns the full ones; the rest of the code speaks full
    slots only and translates with `swa_slots_of`.
    """

    def __init__(self, num_full_slots: int, num_swa_slots: int, page_size: int = 1) -> None:
        self.full = CheckedAllocator(num_full_slots, page_size)
        self.swa = CheckedAllocator(num_swa_slots, page_size)
        self._page_map = np.zeros(self.full.num_pages + 1, dtype=SLOT_DTYPE)

    @property
    def page_size(self) -> int:
        return self.full.page_size

    @property
    def num_pages(self) -> int:
        """Allocatable full pages (page 0 excluded)."""
        return self.full.num_pages

    @property
    def num_swa_pages(self) -> int:
        """Allocatable SWA pages (page 0 excluded)."""
        return self.swa.num_pages

    def reset(self) -> None:
        self.full.reset()
        self.swa.reset()
        self._page_map[:] = 0

    def full_available_size(self) -> int:
        return self.full.available_size()

    def swa_available_size(self) -> int:
        return self.swa.available_size()

    def alloc(self, num_slots: int) -> np.ndarray | None:
        """Full slots (with SWA slots mapped behind them); None if either side is short."""
        num_pages = -(-num_slots // self.page_size)
        if num_pages * self.page_size > min(self.full.available_size(), self.swa.available_size()):
            return None
        full = self.full.alloc(num_slots)
        swa = self.swa.alloc(num_slots)
        p = self.page_size
        self._page_map[full[::p] // p] = swa[::p] // p
        return full

    def free(self, slots: np.ndarray) -> None:
        pages = self.full._pages_of(slots)  # validate both sides before touching either
        if self.full._is_free[pages].any():
            bad = pages[self.full._is_free[pages]][:5].tolist()
            raise DoubleFreeError(f"pages {bad} (page_size={self.page_size}) are already free")
        self.free_swa(slots)
        self.full.free(slots)

    def free_swa(self, slots: np.ndarray) -> None:
        pages = self.full._pages_of(slots)
        swa_pages = self._page_map[pages]
        live = swa_pages != 0
        if live.any():
            p = self.page_size
            self.swa.free(swa_pages[live] * p)
        self._page_map[pages] = 0

    def move_swa(self, from_slots: np.ndarray, to_slots: np.ndarray) -> None:
        """Re-point the SWA pages mapped behind `from_slots` to `to_slots`, position by position (both whole,
        ordered pages of equal length); `from_slots` end unmapped. Raises ValueError, changing nothing, if a
        `from` page maps no SWA page or a `to` page already maps one (that SWA page would leak)."""
        p = self.page_size
        src = np.asarray(from_slots, dtype=SLOT_DTYPE).reshape(-1)
        dst = np.asarray(to_slots, dtype=SLOT_DTYPE).reshape(-1)
        if src.shape != dst.shape or src.size % p:
            raise ValueError(f"move_swa needs equal whole pages, got {src.size} and {dst.size} slots")
        self.full._pages_of(src)  # range checks
        self.full._pages_of(dst)
        src_pages, dst_pages = src[::p] // p, dst[::p] // p
        if (self._page_map[src_pages] == 0).any() or (self._page_map[dst_pages] != 0).any():
            raise ValueError("move_swa: a source page maps no SWA page, or a target page already maps one")
        self._page_map[dst_pages] = self._page_map[src_pages]
        self._page_map[src_pages] = 0

    def swa_slots_of(self, slots: np.ndarray) -> np.ndarray:
        slots = np.asarray(slots, dtype=SLOT_DTYPE)
        p = self.page_size
        swa_pages = self._page_map[slots // p]
        return np.where(swa_pages != 0, swa_pages * p + slots % p, 0)

    def free_slot_ids(self) -> np.ndarray:
        return self.full.free_slot_ids()

    def free_swa_slot_ids(self) -> np.ndarray:
        return self.swa.free_slot_ids()
