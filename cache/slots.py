"""Validation of slot arrays handed to the cache (vectorised; raises before anything changes)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cache.errors import InvalidSlotsError, PageAlignmentError
from cache.keys import SLOT_DTYPE

EMPTY_SLOTS = np.zeros(0, SLOT_DTYPE)  # shared and read-only: a root's value; callers hand out copies
EMPTY_SLOTS.flags.writeable = False


def as_slot_array(slots: Sequence[int] | np.ndarray) -> np.ndarray:
    """Return `slots` as a 1-D int64 array (no copy when it already is one).

    Raises InvalidSlotsError for non-integer or non-1-D input. The caller copies what it stores.
    """
    arr = np.asarray(slots)
    if arr.ndim != 1:
        raise InvalidSlotsError(f"slots must be a 1-D array of slot ids, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, SLOT_DTYPE)
    if arr.dtype.kind not in "iu" or arr.dtype == np.bool_:
        raise InvalidSlotsError(f"slots must be integers, got dtype {arr.dtype}")
    return arr if arr.dtype == SLOT_DTYPE else arr.astype(SLOT_DTYPE)


def check_slots(slots: np.ndarray, page_size: int) -> None:
    """Raise unless `slots` (a 1-D int64 array) are usable tree values: ids outside the reserved page 0, and,
    when `page_size > 1`, whole pages in order (`slots[j*P + i] == page_j * P + i`).

    Raises InvalidSlotsError (reserved / negative ids) or PageAlignmentError (not whole, ordered pages).
    Cost: O(1) numpy calls; with pages, one memcmp of the slots against the whole pages their first slots
    name (equal exactly when every page starts on a multiple of P and runs on by one).
    """
    if slots.size == 0:
        return
    if page_size == 1:
        lo = int(slots.min())
    else:
        if slots.size % page_size:
            raise PageAlignmentError(f"{slots.size} slots are not a whole number of pages of {page_size}")
        firsts = slots[::page_size]
        starts = firsts - firsts % page_size  # the first slot of each page the first slots fall in
        if (starts[:, None] + _page_offsets(page_size)).tobytes() != slots.tobytes():
            raise PageAlignmentError(
                f"slots are not whole pages: {page_size} consecutive slots from a multiple of {page_size}"
            )
        lo = int(firsts.min())
    if lo < page_size:
        raise InvalidSlotsError(
            f"slot {lo} lies in the reserved page 0 (page_size={page_size}) or is negative"
        )


_OFFSETS: dict[int, np.ndarray] = {}


def _page_offsets(page_size: int) -> np.ndarray:
    """`[0, 1, .., P-1]` as int64 (cached per page size, read-only)."""
    offsets = _OFFSETS.get(page_size)
    if offsets is None:
        offsets = _OFFSETS[page_size] = np.arange(page_size, dtype=SLOT_DTYPE)
        offsets.flags.writeable = False
    return offsets
