"""A slot freed by one request and reused by another never exposes the first request's KV to the second.

Requests come and go through the paged allocator, the device page table and a KV pool, as the engine will
drive them. After every operation each live request's row points only at pages it owns, and reading its
first `len` positions through the row returns exactly the K/V it wrote (tagged with its id and position).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxserve.memory import (
    AllocatorFacade,
    RowAllocator,
    clear_rows_donated,
    make_allocator,
    make_kv_pool,
    make_page_table,
    pages_to_slots,
    read_kv_jit,
    set_row_spans_donated,
    write_kv_donated,
)

P, NUM_PAGES, MAX_REQS, MAX_PAGES_PER_REQ, BUCKET = 4, 6, 4, 4, 8


def _tagged_kv(req_id: int, positions: np.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    k = np.zeros((BUCKET, 1, 2), np.float32)
    k[: positions.size, 0, 0] = req_id
    k[: positions.size, 0, 1] = positions
    return jnp.asarray(k), jnp.asarray(-k)


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_reused_slots_never_leak_kv_between_requests(data) -> None:
    alloc = AllocatorFacade(make_allocator(NUM_PAGES, P))
    rows = RowAllocator(MAX_REQS)
    pool = make_kv_pool(1, NUM_PAGES, P, 1, 2, jnp.float32)
    table = make_page_table(MAX_REQS, MAX_PAGES_PER_REQ)
    live: dict[int, tuple[int, list[int]]] = {}  # request id -> (row, slots of its positions)
    next_id = 1
    for _ in range(data.draw(st.integers(1, 12))):
        if live and data.draw(st.booleans()):
            rid = data.draw(st.sampled_from(sorted(live)))
            if data.draw(st.booleans()):  # finish: free slots, clear and free the row
                row, slots = live.pop(rid)
                alloc.free(np.asarray(slots))
                table = clear_rows_donated(table, jnp.array([row], jnp.int32))
                rows.free(row)
                continue
        else:
            row = rows.alloc()
            if row is None:
                continue
            rid, next_id = next_id, next_id + 1
            live[rid] = (row, [])
        row, slots = live[rid]
        n = data.draw(st.integers(1, BUCKET))
        pre = len(slots)
        if pre + n > MAX_PAGES_PER_REQ * P:
            continue
        new = alloc.alloc_extend(np.array([pre]), np.array([pre + n]), np.array([slots[-1] if slots else -1]))
        if new is None:
            if not slots:  # could not start: give the row back
                live.pop(rid)
                rows.free(row)
            continue
        k, v = _tagged_kv(rid, np.arange(pre, pre + n))
        padded = np.zeros(BUCKET, np.int32)  # padding tokens write to slot 0
        padded[:n] = new
        pool = write_kv_donated(pool, jnp.int32(0), jnp.asarray(padded), k, v)
        slots += new.tolist()
        first_new_page = -(-pre // P)
        new_pages = np.zeros((1, MAX_PAGES_PER_REQ), np.int32)
        pages = np.asarray(slots[first_new_page * P :: P]) // P
        new_pages[0, : pages.size] = pages
        table = set_row_spans_donated(
            table,
            jnp.array([row], jnp.int32),
            jnp.array([first_new_page], jnp.int32),
            jnp.asarray(new_pages),
            jnp.array([pages.size], jnp.int32),
        )
        _check_isolation(alloc, pool, table, live)


def _check_isolation(alloc, pool, table, live) -> None:
    host_table = np.asarray(table)
    owned = {rid: {s // P for s in slots} for rid, (_, slots) in live.items()}
    free_pages = set((alloc.free_slot_ids() // P).tolist())
    for rid, (row, slots) in live.items():
        row_pages = host_table[row]
        assert set(row_pages[row_pages != 0].tolist()) == owned[rid]  # only pages it owns
        assert owned[rid].isdisjoint(free_pages)
        assert all(owned[rid].isdisjoint(owned[o]) for o in owned if o != rid)
        row_slots = pages_to_slots(jnp.asarray(row_pages), P)
        k, v = read_kv_jit(pool, 0, row_slots)
        k = np.asarray(k)[: len(slots), 0]
        assert np.array_equal(k[:, 0], np.full(len(slots), rid)), "read another request's KV"
        assert np.array_equal(k[:, 1], np.arange(len(slots)))
        assert np.array_equal(np.asarray(v)[: len(slots), 0], -k)
    assert not host_table[0].any()  # the padding row stays zero
