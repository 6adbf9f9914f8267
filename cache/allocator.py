"""The allocator protocol the cache frees KV through, so that `cache` never imports `jaxserve`.

Units: slots are *full-attention* slot ids (int64). With `page_size > 1` allocators are page-granular:
freeing any slot frees the whole page it lies on, so the cache only ever frees slots of pages it owns whole.
Slot 0 (page 0) is reserved as the padding target and is never handed out nor freed.
`jaxserve.memory` implements these protocols with immutable allocator states behind a mutable facade;
`cache.testing.CheckedAllocator` is a brute-force, double-free-detecting twin for tests and benchmarks.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class SlotAllocator(Protocol):
    """What a RadixCache needs from an allocator: free slots, and report the free set for invariant checks."""

    @property
    def page_size(self) -> int: ...

    def free(self, slots: np.ndarray) -> None:
        """Return these full slots (their whole pages when page_size > 1) to the free set. Empty: no-op."""

    def free_slot_ids(self) -> np.ndarray:
        """Every currently free slot id (debug/invariant checks only; may cost O(pool))."""


@runtime_checkable
class SWASlotAllocator(SlotAllocator, Protocol):
    """A hybrid allocator: every full slot may map to a sliding-window slot.

    `free(slots)` frees the full slots and, through the mapping, their SWA slots. `free_swa(slots)` frees
    only the SWA side and zeroes the mapping, so a later `free` of the same full slots never frees an SWA
    slot twice (SGLang's free-after-tombstone rule).
    """

    def free_swa(self, slots: np.ndarray) -> None:
        """Free the SWA slots mapped from these full slots; unmapped (0) entries are skipped."""

    def move_swa(self, from_slots: np.ndarray, to_slots: np.ndarray) -> None:
        """Re-point the SWA slots mapped behind `from_slots` to `to_slots` (unmapped full slots; equal length,
        whole ordered pages, position by position) and unmap `from_slots`. The SWA tree uses it to revive a
        tombstone: the node keeps its full slots (a live request may read them) and adopts the caller's fresh
        SWA KV; the caller's full slots are then freed (full side only)."""

    def swa_slots_of(self, slots: np.ndarray) -> np.ndarray:
        """The SWA slot of each full slot (0 where none is mapped)."""

    def free_swa_slot_ids(self) -> np.ndarray:
        """Every currently free SWA slot id (debug/invariant checks only)."""
