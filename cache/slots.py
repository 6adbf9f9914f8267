"""Validation of slot arrays handed to the cache (vectorised; raises before anything changes)."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from cache.errors import InvalidSlotsError, PageAlignmentError
from cache.keys import SLOT_DTYPE


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
    """Raise unless `slots` are usable tree values: ids outside the reserved page 0, and, when
    `page_size > 1`, whole pages in order (`slots[j*P + i] == page_j * P + i`).

    Raises InvalidSlotsError (reserved / negative ids) or PageAlignmentError (not whole, ordered pages).
    """
    if slots.size == 0:
        return
    if page_size == 1:
        lo = int(slots.min())
    else:
        if slots.size % page_size:
            raise PageAlignmentError(f"{slots.size} slots are not a whole number of pages of {page_size}")
        pages = slots.reshape(-1, page_size)
        firsts = pages[:, 0]
        lo = int(firsts.min())
        if (firsts % page_size).any() or not (pages - firsts[:, None] == _offsets(page_size)).all():
            raise PageAlignmentError(
                f"slots are not whole pages: {page_size} consecutive slots from a multiple of {page_size}"
            )
    if lo < page_size:
        raise InvalidSlotsError(
            f"slot {lo} lies in the reserved page 0 (page_size={page_size}) or is negative"
        )


@functools.cache
def _offsets(page_size: int) -> np.ndarray:
    return np.arange(page_size, dtype=SLOT_DTYPE)
