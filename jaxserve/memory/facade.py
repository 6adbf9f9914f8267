"""Thin mutable facades over the pure allocator functions: they hold "the current state", nothing else.

They implement `cache.allocator.SlotAllocator` / `SWASlotAllocator`, so a RadixCache frees through them.
Backup is `saved = facade.state` (O(1)); restore is `facade.state = saved` (O(log num_pages): a stale
state raises StaleAllocatorStateError right there). `alloc*` return None when there is not enough room,
like `cache.testing.CheckedAllocator`; the reason is kept in `last_out_of_slots`. Free groups batch many
frees into one write (`free_group_begin/end`); while a group is open, `available_size` does not yet
include the pending frees.
"""

from __future__ import annotations

import numpy as np

from jaxserve.memory import allocator as A
from jaxserve.memory import extend as E
from jaxserve.memory import swa_allocator as S
from jaxserve.memory.allocator import AllocatorState
from jaxserve.memory.errors import InvalidAllocRequestError, OutOfSlots
from jaxserve.memory.swa_allocator import SWAAllocatorState


class _FacadeBase:
    _pure = A  # module with alloc / alloc_extend / free / free_groups / free_slot_ids

    def __init__(self, state) -> None:
        self._state = state
        self._group: list[np.ndarray] | None = None
        self.last_out_of_slots: OutOfSlots | None = None

    @property
    def state(self):
        """The current immutable state (keep it to back up)."""
        return self._state

    @state.setter
    def state(self, new_state) -> None:
        if self._group is not None:
            raise InvalidAllocRequestError("cannot restore a state while a free group is open")
        self._pure.check_state(new_state)  # fail fast on a stale backup; O(log num_pages)
        self._state = new_state

    @property
    def page_size(self) -> int:
        return self._state.page_size

    def _apply(self, result) -> np.ndarray | None:
        if isinstance(result, OutOfSlots):
            self.last_out_of_slots = result
            return None
        self._state, slots = result
        return slots

    def alloc(self, num_slots: int) -> np.ndarray | None:
        """`num_slots` slots (whole pages owned), or None if there is not enough room."""
        return self._apply(self._pure.alloc(self._state, num_slots))

    def free(self, slots: np.ndarray) -> None:
        """Free these slots' pages now, or at `free_group_end` while a group is open (checked now anyway:
        range and double free against the current state raise here, leaving the group as it was)."""
        if self._group is not None:
            full = getattr(self._state, "full", self._state)
            A.check_not_free(full, A.pages_of_slots(full, slots))
            self._group.append(np.asarray(slots).reshape(-1))
            return
        self._state = self._pure.free(self._state, slots)

    def free_group_begin(self) -> None:
        if self._group is not None:
            raise InvalidAllocRequestError("a free group is already open")
        self._group = []

    def free_group_end(self) -> None:
        """Free everything collected since `free_group_begin` in one batch. On error (a page in two of the
        group's frees: a double free) the group is closed and nothing of it is freed."""
        if self._group is None:
            raise InvalidAllocRequestError("free_group_end without free_group_begin")
        group, self._group = self._group, None
        self._state = self._pure.free_groups(self._state, group)

    def free_slot_ids(self) -> np.ndarray:
        return self._pure.free_slot_ids(self._state)


class AllocatorFacade(_FacadeBase):
    """Mutable holder of an `AllocatorState` (token or paged allocator)."""

    _pure = A

    def __init__(self, state: AllocatorState) -> None:
        super().__init__(state)

    @property
    def num_pages(self) -> int:
        """Allocatable pages (page 0 excluded)."""
        return self._state.num_pages

    def available_size(self) -> int:
        return A.available_size(self._state)

    def alloc_extend(self, prefix_lens, seq_lens, last_locs) -> np.ndarray | None:
        """`extend.alloc_extend` on the current state; None (nothing taken) if pages are short."""
        return self._apply(E.alloc_extend(self._state, prefix_lens, seq_lens, last_locs))

    def alloc_decode(self, seq_lens, last_locs) -> np.ndarray | None:
        return self._apply(E.alloc_decode(self._state, seq_lens, last_locs))


class SWAAllocatorFacade(_FacadeBase):
    """Mutable holder of an `SWAAllocatorState`; speaks full slots, translates with `swa_slots_of`."""

    _pure = S

    def __init__(self, state: SWAAllocatorState) -> None:
        super().__init__(state)

    def full_available_size(self) -> int:
        return S.full_available_size(self._state)

    def swa_available_size(self) -> int:
        return S.swa_available_size(self._state)

    def available_size(self) -> int:
        raise NotImplementedError(
            "a hybrid allocator has two sizes: use full_available_size / swa_available_size"
        )

    def alloc_extend(self, prefix_lens, seq_lens, last_locs) -> np.ndarray | None:
        return self._apply(S.alloc_extend(self._state, prefix_lens, seq_lens, last_locs))

    def alloc_decode(self, seq_lens, last_locs) -> np.ndarray | None:
        return self._apply(S.alloc_decode(self._state, seq_lens, last_locs))

    def free_swa(self, slots: np.ndarray) -> None:
        """Free only the SWA side of these full slots (immediately, even inside a free group)."""
        self._state = S.free_swa(self._state, slots)

    @property
    def num_pages(self) -> int:
        """Allocatable full pages."""
        return self._state.full.num_pages

    @property
    def num_swa_pages(self) -> int:
        """Allocatable SWA pages."""
        return self._state.swa.num_pages

    def move_swa(self, from_slots: np.ndarray, to_slots: np.ndarray) -> None:
        """`swa_allocator.move_swa` on the current state (tombstone revival)."""
        self._state = S.move_swa(self._state, from_slots, to_slots)

    def swa_slots_of(self, slots: np.ndarray) -> np.ndarray:
        return S.swa_slots_of(self._state, slots)

    def free_swa_slot_ids(self) -> np.ndarray:
        return S.free_swa_slot_ids(self._state)
