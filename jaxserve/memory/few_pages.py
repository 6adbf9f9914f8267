"""The pages of a few slots as Python ints: the front of the allocators' frees of a handful of slots.

A finished request usually frees only its tail (under one page, or one slot under EAGLE). For a handful of
slots the dozen numpy calls of the vectorised path (type, range, sort, de-duplication, double-free lookup,
push) cost far more than the work, so `allocator.free` and `swa_allocator.free` run the same rules on Python
ints when `few_pages_of_slots` answers. It answers only for input the vectorised path would accept (a short
1-D integer array, every slot in range); anything else gives None and the caller takes the vectorised path,
which raises the precise error. Units: slots in, page ids out (page = slot // page_size).
"""

from __future__ import annotations

import numpy as np

FEW_SLOTS = 32  # up to this many slots per call the Python-int path is the cheaper one


def few_pages_of_slots(slots: object, page_size: int, num_pages: int) -> list[int] | None:
    """Sorted distinct pages of `slots` as Python ints, when `slots` is a 1-D integer numpy array of at most
    `FEW_SLOTS` slots, all in `[page_size, (num_pages + 1) * page_size)`; None otherwise (nothing raised).
    Pages `1..num_pages` are the allocatable ones."""
    if type(slots) is not np.ndarray or slots.ndim != 1 or slots.shape[0] > FEW_SLOTS:
        return None
    if slots.dtype.kind not in "iu":
        return None
    values = slots.tolist()
    if not values:
        return values
    if min(values) < page_size or max(values) >= (num_pages + 1) * page_size:
        return None
    return sorted(set(values)) if page_size == 1 else sorted({v // page_size for v in values})
