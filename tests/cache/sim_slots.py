"""Test helper shared by `radix_sim` and `swa_sim`: grow a request's slots the way the scheduler does.
Not a test module."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from cache import CachedReq
from cache.keys import SLOT_DTYPE


def grow_kv_slots(req: CachedReq, num_new: int, alloc: Any, make_room: Callable[[int], object]) -> bool:
    """Give `req` slots for its next `num_new` positions: first the rest of its partial last page (its own),
    then fresh pages from `alloc`, after `make_room(num_slots)` (whole pages) lets the tree evict when the
    pool is short. False (the request unchanged) if `alloc` cannot supply them."""
    page_size = alloc.page_size
    kv = req.kv_slots
    in_page = min(-kv.shape[0] % page_size, num_new)
    head = kv[-1] + 1 + np.arange(in_page, dtype=SLOT_DTYPE) if in_page else np.zeros(0, SLOT_DTYPE)
    rest = num_new - in_page
    fresh = np.zeros(0, SLOT_DTYPE)
    if rest:
        make_room(-(-rest // page_size) * page_size)
        fresh = alloc.alloc(rest)
        if fresh is None:
            return False
    req.kv_slots = np.concatenate([kv, head, fresh])
    return True
