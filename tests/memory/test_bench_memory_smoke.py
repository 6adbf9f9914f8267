"""The memory benchmark's building blocks run end to end on tiny sizes (no timing is asserted)."""

from __future__ import annotations

import pytest

from jaxserve.bench import memory as bench

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it


def test_write_timing_and_allocator_table_run_on_tiny_pools() -> None:
    times = bench.interleaved_write_times((8, 9), samples=2, copy_reps=1)
    assert set(times) >= {"donated 1 layer", "donated all layers", "copy all layers"}
    assert all(len(v) == 2 and min(v) > 0 for v in times.values())
    table = bench.allocator_table((8, 10), ops=5, batches=2)
    assert set(table) >= {"token alloc+free", "swa alloc+free", "backup", "restore"}
    assert all(min(v) > 0 for v in table.values())


def test_donated_pool_writer_keeps_its_buffer() -> None:
    writer = bench.PoolWriter(8)
    ptr = writer.pool.data.unsafe_buffer_pointer()
    for all_layers in (False, True):
        writer.donated(all_layers, "pages")
    assert writer.pool.data.unsafe_buffer_pointer() == ptr
