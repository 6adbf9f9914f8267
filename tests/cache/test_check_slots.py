"""`cache.slots.check_slots` (one memcmp against the whole pages the first slots name) accepts exactly the
arrays the per-slot rule accepts - every slot outside page 0, and with pages, `slots[j*P + i] == page_j*P + i`
- and raises the same error kind first (alignment before range)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache.errors import InvalidSlotsError, PageAlignmentError
from cache.slots import check_slots


def rule(slots: list[int], page_size: int) -> type[Exception] | None:
    if not slots:
        return None
    if page_size > 1:
        if len(slots) % page_size:
            return PageAlignmentError
        for j in range(0, len(slots), page_size):
            first = slots[j]
            if first % page_size or slots[j : j + page_size] != list(range(first, first + page_size)):
                return PageAlignmentError
    return InvalidSlotsError if min(slots) < page_size else None


@st.composite
def slot_arrays(draw, page_size: int) -> list[int]:
    pages = draw(st.lists(st.integers(-2, 9), max_size=5))
    slots = [p * page_size + i for p in pages for i in range(page_size)]
    if slots and draw(st.booleans()):  # perturb one slot, or cut the tail
        i = draw(st.integers(0, len(slots) - 1))
        if draw(st.booleans()):
            slots[i] += draw(st.sampled_from([-page_size, -1, 1, page_size]))
        else:
            slots = slots[:i]
    return slots


@settings(max_examples=300, deadline=None)
@given(data=st.data(), page_size=st.sampled_from([1, 2, 3, 4]))
def test_check_slots_equals_the_per_slot_rule(data, page_size: int) -> None:
    slots = data.draw(slot_arrays(page_size))
    expected = rule(slots, page_size)
    arr = np.array(slots, dtype=np.int64)
    if expected is None:
        check_slots(arr, page_size)
    else:
        with pytest.raises(expected):
            check_slots(arr, page_size)
