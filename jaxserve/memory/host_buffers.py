"""Host arrays laid out for cheap host-to-device transfers: 64-byte aligned.

On the CPU backend a jitted call takes a numpy argument whose data is 64-byte aligned without copying it
(the device buffer aliases the host one); any other numpy argument is copied first, through a path that is
far slower than a memcpy: on a 2-core CPU, a 32 x 4,096 int32 page table (512 KiB) cost a call 71 us
unaligned against 8 us aligned, and a plain copy of it takes 9 us. numpy aligns its data to 16 bytes only,
so a step input built with `np.zeros` is aliased or copied by chance. On an accelerator the transfer is a
copy either way and the alignment costs nothing.

Contract for an aligned array handed to a jitted call: nothing writes it afterwards. The device array
aliasing it may be read while the call runs asynchronously, and for as long as it lives; a write would
change what the call computes. Step inputs are built fresh for each call and dropped after it, so this
holds for them.
"""

from __future__ import annotations

import math

import numpy as np

ALIGNMENT = 64  # bytes: what the CPU client requires to alias a host buffer


def aligned_empty(shape: int | tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts at a multiple of `ALIGNMENT` bytes (when it
    has any: an empty array has no data to transfer)."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start: start + nbytes].view(dtype).reshape(shape)


def aligned_full(shape: int | tuple[int, ...], value: int | float, dtype: np.dtype | type) -> np.ndarray:
    """`aligned_empty` filled with `value`."""
    out = aligned_empty(shape, dtype)
    out.fill(value)
    return out


def aligned_zeros(shape: int | tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """`aligned_empty` filled with zeros."""
    return aligned_full(shape, 0, dtype)
