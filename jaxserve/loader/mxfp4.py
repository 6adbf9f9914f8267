"""MXFP4 (OCP microscaling FP4) dequantization for gpt-oss expert weights, in numpy on the host.

Checkpoint layout (reference eagle3-gptoss.md section 1.4): for a weight with `rows` output rows and
`cols = G * 32` input columns per expert,
- `<name>_blocks` uint8 [E, rows, G, 16]: 32 E2M1 codes per block, two per byte; in byte j the low nibble
  is element 2j and the high nibble element 2j+1;
- `<name>_scales` uint8 [E, rows, G]: one E8M0 exponent per block, bias 127.
value = FP4_LUT[code] * 2**(scale - 127). The dequantized [E, rows, cols] array is then transposed to the
input-major layout the model multiplies with (x @ W): [E, cols, rows].

Memory: the output is allocated once in the target dtype and filled one expert at a time, so the float32
temporaries are bounded by one expert's [rows, cols] matrix (about 66 MB for gpt-oss-20b's gate_up).
"""

from __future__ import annotations

import numpy as np

# E2M1 code -> value. Codes 0-7 are the non-negative values, 8-15 the same values negated (sign bit 3).
FP4_LUT = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32
)
SCALE_BIAS = 127
BLOCK_SIZE = 32  # values per block; 16 bytes


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
    codes = np.empty((*blocks.shape[:-1], BLOCK_SIZE), dtype=np.uint8)
    codes[..., 0::2] = blocks & 0x0F
    codes[..., 1::2] = blocks >> 4
    values = FP4_LUT[codes]
    exponents = scales.astype(np.int32)[..., None] - SCALE_BIAS
    values = np.ldexp(values, exponents)
    return values.reshape(*blocks.shape[:-2], blocks.shape[-2] * BLOCK_SIZE)


def dequantize_experts(
    blocks: np.ndarray, scales: np.ndarray, dtype=np.float32, name: str = "mxfp4"
) -> np.ndarray:
    """Expert weights: blocks [E, rows, G, 16], scales [E, rows, G] -> input-major `dtype` [E, G * 32, rows].

    Streams one expert at a time (bounded float32 temporaries); `dtype` may be any numpy dtype, including
    ml_dtypes' bfloat16 (every MXFP4 value with a normal result is exact in bfloat16).
    """
    _check(blocks, scales, name)
    if blocks.ndim != 4:
        raise Mxfp4FormatError(
            f"{name}_blocks: expected [experts, rows, blocks, 16], got shape {blocks.shape}"
        )
    num_experts, rows, num_blocks, _ = blocks.shape
    out = np.empty((num_experts, num_blocks * BLOCK_SIZE, rows), dtype=dtype)
    for e in range(num_experts):
        out[e] = dequantize_blocks(blocks[e], scales[e], name).T
    return out
