"""The device page table vs a numpy reference, donation, and the host row allocator."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxserve.memory import (
    DoubleFreeError,
    InvalidAllocRequestError,
    RowAllocator,
    clear_rows_donated,
    make_page_table,
    pages_to_slots,
    set_row_spans_donated,
    set_rows_donated,
)

MAX_REQS, MAX_PAGES, WIDTH, N = 6, 8, 3, 4  # fixed shapes: one compile per function


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_row_updates_match_a_numpy_reference(data) -> None:
    table = make_page_table(MAX_REQS, MAX_PAGES)
    ref = np.zeros((MAX_REQS, MAX_PAGES), np.int32)
    for _ in range(data.draw(st.integers(1, 4))):
        if data.draw(st.booleans()):
            # distinct rows (row MAX_REQS = padding, dropped): spans never overlap, so the order is irrelevant
            rows = np.array(
                data.draw(st.lists(st.integers(0, MAX_REQS), min_size=N, max_size=N, unique=True))
            )
            rows = rows.astype(np.int32)
            starts = np.array(
                data.draw(st.lists(st.integers(0, MAX_PAGES), min_size=N, max_size=N)), np.int32
            )
            lens = np.array(data.draw(st.lists(st.integers(0, WIDTH), min_size=N, max_size=N)), np.int32)
            vals = np.array(data.draw(st.lists(st.integers(1, 99), min_size=N * WIDTH, max_size=N * WIDTH)))
            vals = vals.reshape(N, WIDTH).astype(np.int32)
            for i in range(N):  # reference: entries outside the table are dropped
                for j in range(lens[i]):
                    if rows[i] < MAX_REQS and starts[i] + j < MAX_PAGES:
                        ref[rows[i], starts[i] + j] = vals[i, j]
            old = table
            table = set_row_spans_donated(table, *map(jnp.asarray, (rows, starts, vals, lens)))
            assert old.is_deleted()
        else:
            rows = np.array(data.draw(st.lists(st.integers(0, MAX_REQS), min_size=2, max_size=2)), np.int32)
            ref[rows[rows < MAX_REQS]] = 0
            table = clear_rows_donated(table, jnp.asarray(rows))
        assert np.array_equal(np.asarray(table), ref)


def test_set_rows_writes_full_width_spans_and_donates() -> None:
    table = make_page_table(MAX_REQS, MAX_PAGES)
    old = table
    table = set_rows_donated(table, jnp.array([2, 5]), jnp.array([1, 6]), jnp.array([[7, 8, 9], [4, 5, 6]]))
    assert old.is_deleted()
    ref = np.zeros((MAX_REQS, MAX_PAGES), np.int32)
    ref[2, 1:4] = [7, 8, 9]
    ref[5, 6:8] = [4, 5]  # the column past the table's width is dropped
    assert np.array_equal(np.asarray(table), ref)


def test_pages_to_slots_expands_page_major() -> None:
    pages = jnp.array([[3, 1, 0]])
    assert pages_to_slots(pages, 4).tolist() == [[12, 13, 14, 15, 4, 5, 6, 7, 0, 1, 2, 3]]


def test_row_allocator_reserves_row_zero_and_detects_double_free() -> None:
    rows = RowAllocator(4)
    got = [rows.alloc(), rows.alloc(), rows.alloc()]
    assert got == [1, 2, 3] and rows.alloc() is None
    rows.free(2)
    with pytest.raises(DoubleFreeError):
        rows.free(2)
    with pytest.raises(InvalidAllocRequestError):
        rows.free(0)
    assert rows.alloc() == 2 and rows.available() == 0


def test_bad_shapes_raise() -> None:
    table = make_page_table(MAX_REQS, MAX_PAGES)
    with pytest.raises(InvalidAllocRequestError):
        set_row_spans_donated(
            table, jnp.zeros(2, jnp.int32), jnp.zeros(3, jnp.int32), jnp.zeros((2, 2)), jnp.zeros(2)
        )
    with pytest.raises(InvalidAllocRequestError):
        make_page_table(1, 4)
