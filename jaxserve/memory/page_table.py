"""The request-to-page table: a device int32 array `[max_reqs, max_pages_per_req]`, plus its row allocator.

Row r holds, at column j, the page id of request r's j-th page (== its slot id when page_size is 1);
0 means unused and points at the reserved padding page, so a padded gather through a row reads page 0.
Row 0 is reserved as the padding row: the row allocator never hands it out and it stays all zeros, so a
padded sequence in a step batch can use row 0.

Updates are functional and donated (`*_donated`): `set_row_spans` writes a span of page ids into each
given row, `clear_rows` zeroes whole rows when their requests finish. Both are O(entries written).
Padding entries (row id >= max_reqs, or columns past a span's length) are dropped on device.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.memory.errors import DoubleFreeError, InvalidAllocRequestError


def make_page_table(max_reqs: int, max_pages_per_req: int) -> jax.Array:
    """An all-zero table (every entry points at the padding page)."""
    if max_reqs < 2 or max_pages_per_req < 1:
        raise InvalidAllocRequestError(
            f"need max_reqs >= 2 (row 0 is the padding row) and max_pages_per_req >= 1, "
            f"got {max_reqs=}, {max_pages_per_req=}"
        )
    return jnp.zeros((max_reqs, max_pages_per_req), jnp.int32)


def set_row_spans(
    table: jax.Array, row_ids: jax.Array, start_cols: jax.Array, values: jax.Array, lengths: jax.Array
) -> jax.Array:
    """For each i: `table[row_ids[i], start_cols[i] + j] = values[i, j]` for `j < lengths[i]`.

    Shapes: row_ids, start_cols, lengths `[n]`; values `[n, w]` int32. Entries outside the table drop.
    """
    if values.ndim != 2 or not (row_ids.shape == start_cols.shape == lengths.shape == values.shape[:1]):
        raise InvalidAllocRequestError(
            "need row_ids/start_cols/lengths [n] and values [n, w]; got "
            f"{row_ids.shape}, {start_cols.shape}, {lengths.shape}, {values.shape}"
        )
    j = jnp.arange(values.shape[1], dtype=jnp.int32)[None, :]
    cols = jnp.where(j < lengths[:, None], start_cols[:, None] + j, table.shape[1])  # masked -> dropped
    rows = jnp.broadcast_to(row_ids[:, None], cols.shape)
    return table.at[rows, cols].set(values.astype(table.dtype), mode="drop")


def set_rows(table: jax.Array, row_ids: jax.Array, start_cols: jax.Array, values: jax.Array) -> jax.Array:
    """`set_row_spans` with every span the full width of `values` `[n, w]`."""
    lengths = jnp.full(row_ids.shape, values.shape[1], jnp.int32)
    return set_row_spans(table, row_ids, start_cols, values, lengths)


def clear_rows(table: jax.Array, row_ids: jax.Array) -> jax.Array:
    """Zero these rows (finished requests). Row ids >= max_reqs are dropped (padding)."""
    zeros = jnp.zeros((row_ids.shape[0], table.shape[1]), table.dtype)
    return table.at[row_ids].set(zeros, mode="drop")


def pages_to_slots(pages: jax.Array, page_size: int) -> jax.Array:
    """The slots of a row's pages, page-major: `[..., P] -> [..., P * page_size]` (for gathers)."""
    slots = pages[..., None] * page_size + jnp.arange(page_size, dtype=pages.dtype)
    return slots.reshape(*pages.shape[:-1], pages.shape[-1] * page_size)


set_row_spans_donated = jax.jit(set_row_spans, donate_argnums=0)
set_rows_donated = jax.jit(set_rows, donate_argnums=0)
clear_rows_donated = jax.jit(clear_rows, donate_argnums=0)


class RowAllocator:
    """Host-side free list of page-table rows `1..max_reqs-1` (row 0 is the padding row). O(1) per op."""

    def __init__(self, max_reqs: int) -> None:
        if max_reqs < 2:
            raise InvalidAllocRequestError(f"need max_reqs >= 2 (row 0 is the padding row), got {max_reqs}")
        self.max_reqs = max_reqs
        self._free = list(range(max_reqs - 1, 0, -1))  # pop() hands out 1, 2, ...
        self._is_free = np.ones(max_reqs, dtype=bool)
        self._is_free[0] = False

    def available(self) -> int:
        return len(self._free)

    def alloc(self) -> int | None:
        """A free row id, or None when every row is in use."""
        if not self._free:
            return None
        row = self._free.pop()
        self._is_free[row] = False
        return row

    def free(self, row: int) -> None:
        """Return a row; the caller must also clear it on device (`clear_rows`) before reuse."""
        if not 1 <= row < self.max_reqs:
            raise InvalidAllocRequestError(f"row {row} out of range [1, {self.max_reqs})")
        if self._is_free[row]:
            raise DoubleFreeError(f"page-table row {row} is already free")
        self._is_free[row] = True
        self._free.append(row)
