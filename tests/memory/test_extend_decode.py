"""alloc_extend / alloc_decode vs a model of requests, each owning whole pages position-aligned."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxserve.memory import allocator as A
from jaxserve.memory import extend as E
from jaxserve.memory.errors import InvalidAllocRequestError, OutOfSlots


def _check_request_layout(slots: list[int], p: int) -> None:
    """Position j sits at offset j % P of the request's (j // P)-th page; pages are distinct."""
    arr = np.asarray(slots)
    assert np.array_equal(arr % p, np.arange(arr.size) % p)
    pages = arr // p
    for block in range(-(-arr.size // p)):
        assert len(set(pages[block * p : (block + 1) * p].tolist())) == 1
    assert len(set(pages[::p].tolist())) == len(pages[::p])


@settings(max_examples=60, deadline=None)
@given(num_pages=st.integers(2, 16), page_size=st.sampled_from([1, 2, 4]), data=st.data())
def test_extend_and_decode_match_a_request_model(num_pages: int, page_size: int, data) -> None:
    p = page_size
    state = A.make_allocator(num_pages, p)
    free = set(range(1, num_pages + 1))
    reqs: dict[int, list[int]] = {}  # request id -> slots of positions 0..len-1
    next_id = 0
    for _ in range(data.draw(st.integers(1, 20))):
        op = data.draw(st.sampled_from(["new", "extend", "decode", "finish"]))
        if op == "new":
            reqs[next_id] = []
            next_id += 1
            continue
        if op == "finish" and reqs:
            rid = data.draw(st.sampled_from(sorted(reqs)))
            slots = reqs.pop(rid)
            if slots:
                state = A.free(state, np.asarray(slots))
                free |= {s // p for s in slots}
            continue
        live = sorted(reqs) if op == "extend" else sorted(r for r in reqs if reqs[r])
        if op not in ("extend", "decode") or not live:
            continue
        batch = data.draw(st.lists(st.sampled_from(live), min_size=1, max_size=3, unique=True))
        pre = np.array([len(reqs[r]) for r in batch])
        add = np.array([data.draw(st.integers(1, 2 * p + 1)) if op == "extend" else 1 for r in batch])
        last = np.array([reqs[r][-1] if reqs[r] else -1 for r in batch])
        if op == "extend":
            result = E.alloc_extend(state, pre, pre + add, last)
        else:
            result = E.alloc_decode(state, pre + 1, last)
        need = int((-(-(pre + add) // p) - (-(-pre // p))).sum())
        if need > len(free):
            assert isinstance(result, OutOfSlots) and result.requested_pages == need
            assert A.available_size(state) == len(free) * p  # all or nothing
            continue
        state, out = result
        assert out.size == add.sum()
        offset = 0
        new_pages: set[int] = set()
        for r, n in zip(batch, add, strict=True):
            chunk = out[offset : offset + n].tolist()
            offset += n
            old_pages = {s // p for s in reqs[r]}
            new_pages |= {s // p for s in chunk} - old_pages
            reqs[r] += chunk
            _check_request_layout(reqs[r], p)
        assert len(new_pages) == need and new_pages <= free
        free -= new_pages
        assert A.available_size(state) == len(free) * p
    owned = [s // p for slots in reqs.values() for s in slots]
    assert set(owned).isdisjoint(free)
    assert A.free_slot_ids(state).tolist() == sorted(q * p + o for q in free for o in range(p))


def test_extend_continues_the_partial_page_then_takes_new_pages() -> None:
    """P=4: a 6-token request on slots 4..9 extended to 11 tokens -> 10, 11, then a new page's 0..2."""
    state = A.make_allocator(8, 4)
    state, first = E.alloc_extend(state, np.array([0]), np.array([6]), np.array([-1]))
    assert first.tolist() == [4, 5, 6, 7, 8, 9]
    state, more = E.alloc_extend(state, np.array([6]), np.array([11]), np.array([9]))
    assert more.tolist() == [10, 11, 12, 13, 14]
    state, one = E.alloc_decode(state, np.array([12]), np.array([14]))
    assert one.tolist() == [15]
    state, one = E.alloc_decode(state, np.array([13]), np.array([15]))  # position 12 starts a new page
    assert one.tolist() == [16]


def test_extend_rejects_inconsistent_arguments() -> None:
    state = A.make_allocator(8, 4)
    state, _ = A.alloc(state, 6)
    bad_calls = [
        (np.array([6]), np.array([5]), np.array([9])),  # seq < prefix
        (np.array([6]), np.array([8]), np.array([10])),  # last_loc offset != (prefix - 1) % P
        (np.array([6]), np.array([8]), np.array([2])),  # last_loc on the padding page
        (np.array([2]), np.array([3]), np.array([25])),  # last_loc on a free page (page 6)
        (np.array([6]), np.array([6]), np.array([9])),  # nothing to allocate
        (np.array([6, 1]), np.array([8]), np.array([9])),  # ragged
    ]
    for pre, seq, last in bad_calls:
        with pytest.raises(InvalidAllocRequestError):
            E.alloc_extend(state, pre, seq, last)
    assert A.available_size(state) == 24
