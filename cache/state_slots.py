"""`allocate_state_slots`: fresh slots for a `TreeState` from another allocator (a restarted process), so
that the state can be imported there (`import_state`) after the caller wrote the saved KV into them.

Units: full slots. For an SWA state, live nodes get full slots with SWA slots mapped behind them and
tombstones full slots with none (allocated, then their SWA side freed), which is what the SWA tree's
import checks. Tombstones are served first, so the SWA side never needs more than
`max(tombstone units, live units)` free slots at once.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cache.errors import OutOfSlotsError
from cache.keys import SLOT_DTYPE
from cache.tree_state import TreeState


def allocate_state_slots(state: TreeState, allocator: Any) -> TreeState:
    """`state` over slots newly taken from `allocator` (it needs `alloc(n) -> slots | None`, plus `free`, and
    `free_swa` for an SWA state); node i's new slots hold the position its old ones held. Raises
    OutOfSlotsError, having given back what it took, when the allocator is short."""
    per_slot_live = np.repeat(state.live, state.num_units)
    new = np.zeros(state.slots.shape[0], SLOT_DTYPE)
    taken = []
    try:
        for live in (False, True):
            where = per_slot_live == live
            count = int(where.sum())
            if count == 0:
                continue
            slots = allocator.alloc(count)
            if slots is None:
                raise OutOfSlotsError(f"the allocator cannot give {count} slots for the state")
            taken.append(slots)
            if not live:
                allocator.free_swa(slots)
            new[where] = slots
    except OutOfSlotsError:
        for slots in taken:
            allocator.free(slots)
        raise
    return state.with_slots(new)
