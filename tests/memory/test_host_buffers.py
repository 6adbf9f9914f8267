"""`host_buffers`: aligned arrays are aligned, shaped and typed as asked, and on the CPU backend a jitted
call reads one without copying it (the reason they exist) while it copies a misaligned one."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxserve.layers.attention_metadata import SequenceStep, build_attention_metadata
from jaxserve.memory.host_buffers import ALIGNMENT, aligned_empty, aligned_full, aligned_zeros


@settings(max_examples=100, deadline=None)
@given(shape=st.lists(st.integers(0, 70), max_size=3).map(tuple),
       dtype=st.sampled_from([np.int8, np.int32, np.float32, np.int64, np.uint32, np.bool_]))
def test_aligned_arrays_have_the_shape_dtype_and_alignment_asked_for(shape, dtype):
    for make in (aligned_empty, aligned_zeros):
        a = make(shape, dtype)
        assert a.shape == shape and a.dtype == np.dtype(dtype) and a.flags.c_contiguous and a.flags.writeable
        assert a.size == 0 or a.ctypes.data % ALIGNMENT == 0  # an empty array has no data to transfer
    assert not aligned_zeros(shape, dtype).any()
    full = aligned_full(shape, 1, dtype)
    assert full.size == 0 or full.ctypes.data % ALIGNMENT == 0
    assert np.array_equal(full, np.ones(shape, dtype))
    assert aligned_empty(7, np.int32).shape == (7,)


def _misaligned(shape: tuple[int, ...], dtype) -> np.ndarray:
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.zeros(n + 2 * ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT + 16
    return raw[start: start + n].view(dtype).reshape(shape)


def test_the_cpu_backend_aliases_an_aligned_argument_and_copies_a_misaligned_one():
    if jax.default_backend() != "cpu":
        pytest.fail("this check is about the CPU backend, which the test suite runs on")
    aligned, misaligned = aligned_zeros((32, 4096), np.int32), _misaligned((32, 4096), np.int32)
    assert aligned.ctypes.data % ALIGNMENT == 0 and misaligned.ctypes.data % ALIGNMENT != 0
    assert jax.device_put(aligned).unsafe_buffer_pointer() == aligned.ctypes.data
    assert jax.device_put(misaligned).unsafe_buffer_pointer() != misaligned.ctypes.data


def test_page_tables_are_aligned():
    steps = [SequenceStep(1, n, np.arange(n, dtype=np.int32)) for n in (3, 700, 41)]
    meta = build_attention_metadata(steps, page_size=1)
    assert meta.page_table.ctypes.data % ALIGNMENT == 0
    assert [list(meta.page_table[i, :n]) for i, n in enumerate((3, 700, 41))] == [
        list(range(n)) for n in (3, 700, 41)]
