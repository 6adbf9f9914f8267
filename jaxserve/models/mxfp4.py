"""MXFP4 (OCP microscaling FP4) dequantization for gpt-oss expert weights, in numpy on the host.

Checkpoint layout (the gpt-oss Hub checkpoints): for a weight with `rows` output rows and
`cols = G * 32` input columns per expert,
- `<name>_blocks` uint8 [E, rows, G, 16]: 32 E2M1 codes per block, two per byte; in byte j the low nibble
  is element 2j and the high nibble element 2j+1;
- `<name>_scales` uint8 [E, rows, G]: one E8M0 exponent per block, bias 127.
value = FP4_LUT[code] * 2**(scale - 127). The dequantized [E, rows, cols] array is then transposed to the
input-major layout the model multiplies with (x @ W): [E, cols, rows].

Memory: the output is allocated once in the target dtype and filled 512 rows of one expert at a time, so the
float32 temporaries stay bounded (about 6 MB for gpt-oss-20b's gate_up).
"""

from __future__ import annotations

import numpy as np

# E2M1 code -> value. Codes 0-7 are the non-negative values, 8-15 the same values negated (sign bit 3).
FP4_LUT = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32
)
SCALE_BIAS = 127
BLOCK_SIZE = 32  # values per block; 16 bytes
# byte -> its two values (low nibble first), doubled; times 2**(scale - 128) below. Splitting the power of
# two this way keeps every factor finite in float32 (2**-128 .. 2**127), and each product is exact or
# overflows exactly where ldexp(value, scale - 127) does, so the result equals the per-element definition.
_BYTE_PAIRS_X2 = 2 * np.stack([FP4_LUT[np.arange(256) & 0x0F], FP4_LUT[np.arange(256) >> 4]], axis=-1)
_POW2_HALF = np.ldexp(np.float32(1), np.arange(256) - SCALE_BIAS - 1).astype(np.float32)
_ROWS_PER_CHUNK = 512  # bounds the float32 temporaries to ~512 * cols * 4 bytes and keeps transposes cached


class Mxfp4FormatError(ValueError):
    """blocks/scales tensors whose dtype or shape is not MXFP4."""


def _check(blocks: np.ndarray, scales: np.ndarray, name: str) -> None:
    if blocks.dtype != np.uint8 or scales.dtype != np.uint8:
        raise Mxfp4FormatError(
            f"{name}: MXFP4 blocks/scales must be uint8, got {blocks.dtype} and {scales.dtype}"
        )
    if blocks.ndim < 2 or blocks.shape[-1] != BLOCK_SIZE // 2:
        raise Mxfp4FormatError(f"{name}_blocks: last axis must hold 16 bytes per block, shape {blocks.shape}")
    if scales.shape != blocks.shape[:-1]:
        raise Mxfp4FormatError(
            f"{name}: scales shape {scales.shape} must equal blocks shape without its last axis "
            f"{blocks.shape[:-1]}"
        )


def dequantize_blocks(blocks: np.ndarray, scales: np.ndarray, name: str = "mxfp4") -> np.ndarray:
    """blocks uint8 [..., G, 16], scales uint8 [..., G] -> float32 [..., G * 32] (row-major, no transpose)."""
    _check(blocks, scales, name)
    values = _BYTE_PAIRS_X2[blocks].reshape(*blocks.shape[:-1], BLOCK_SIZE)
    with np.errstate(over="ignore"):  # scale 255 (E8M0's NaN code) overflows to inf, as ldexp does
        values *= _POW2_HALF[scales][..., None]
    return values.reshape(*blocks.shape[:-2], blocks.shape[-2] * BLOCK_SIZE)


def dequantize_experts(
    blocks: np.ndarray, scales: np.ndarray, dtype=np.float32, name: str = "mxfp4"
) -> np.ndarray:
    """Expert weights: blocks [E, rows, G, 16], scales [E, rows, G] -> input-major `dtype` [E, G * 32, rows].

    Streams 512 rows of one expert at a time (bounded float32 temporaries); `dtype` may be any numpy dtype,
    including ml_dtypes' bfloat16 (every MXFP4 value is exact in bfloat16). Cost: O(E * rows * cols), about
    0.3-0.6 s per gpt-oss-20b gate_up expert [5760 x 2880] on one CPU core.
    """
    _check(blocks, scales, name)
    if blocks.ndim != 4:
        raise Mxfp4FormatError(
            f"{name}_blocks: expected [experts, rows, blocks, 16], got shape {blocks.shape}"
        )
    num_experts, rows, num_blocks, _ = blocks.shape
    out = np.empty((num_experts, num_blocks * BLOCK_SIZE, rows), dtype=dtype)
    for e in range(num_experts):
        for r0 in range(0, rows, _ROWS_PER_CHUNK):
            r1 = min(r0 + _ROWS_PER_CHUNK, rows)
            out[e, :, r0:r1] = dequantize_blocks(blocks[e, r0:r1], scales[e, r0:r1], name).T
    return out
