"""MXFP4 dequantization: brute-force per-element decode, layout (input-major), errors, HF parity."""

import ml_dtypes
import numpy as np
import pytest

from jaxserve.models.mxfp4 import Mxfp4FormatError, dequantize_blocks, dequantize_experts


def _bruteforce_value(code: int, scale: int) -> float:
    """Decode one E2M1 code from its bits: sign s, exponent e (2 bits, bias 1), mantissa m (1 bit)."""
    sign = -1.0 if code & 0b1000 else 1.0
    exp_bits, mantissa = (code >> 1) & 0b11, code & 0b1
    magnitude = mantissa * 0.5 if exp_bits == 0 else (1 + mantissa / 2) * 2.0 ** (exp_bits - 1)
    return sign * magnitude * 2.0 ** (scale - 127)


def _random_mxfp4(rng, shape_rows, num_blocks, scale_lo=120, scale_hi=134):
    blocks = rng.integers(0, 256, size=(*shape_rows, num_blocks, 16), dtype=np.uint8)
    scales = rng.integers(scale_lo, scale_hi, size=(*shape_rows, num_blocks), dtype=np.uint8)
    return blocks, scales


def test_every_code_decodes_like_its_bits():
    # byte b = hi << 4 | lo for all 256 bytes: one block row per 16 bytes
    blocks = np.arange(256, dtype=np.uint8).reshape(1, 16, 16)
    scales = np.full((1, 16), 127, dtype=np.uint8)
    got = dequantize_blocks(blocks, scales).reshape(-1)
    want = [_bruteforce_value(code, 127) for b in range(256) for code in (b & 0xF, b >> 4)]
    np.testing.assert_array_equal(got, np.array(want, dtype=np.float32))


def test_experts_match_bruteforce_decode_and_are_input_major():
    rng = np.random.default_rng(0)
    num_experts, rows, num_blocks = 2, 3, 2
    blocks, scales = _random_mxfp4(rng, (num_experts, rows), num_blocks, scale_lo=1, scale_hi=255)
    scales[0, 0] = [0, 255]  # extreme exponents: subnormal float32 results, and overflow to inf
    got = dequantize_experts(blocks, scales)
    assert got.shape == (num_experts, num_blocks * 32, rows)
    for e in range(num_experts):
        for r in range(rows):
            for g in range(num_blocks):
                for j in range(16):
                    byte = int(blocks[e, r, g, j])
                    for half, code in enumerate((byte & 0xF, byte >> 4)):
                        col = g * 32 + 2 * j + half
                        want = _bruteforce_value(code, int(scales[e, r, g]))
                        with np.errstate(over="ignore"):
                            assert got[e, col, r] == np.float32(want), (e, r, col)


def test_chunked_rows_match_one_shot_decode():
    rng = np.random.default_rng(3)
    blocks, scales = _random_mxfp4(rng, (1, 1100), 1)  # more rows than one 512-row chunk
    want = dequantize_blocks(blocks[0], scales[0]).T
    np.testing.assert_array_equal(dequantize_experts(blocks, scales)[0], want)


def test_bfloat16_output_is_exact():
    rng = np.random.default_rng(1)
    blocks, scales = _random_mxfp4(rng, (2, 4), 3)
    f32 = dequantize_experts(blocks, scales)
    bf16 = dequantize_experts(blocks, scales, dtype=ml_dtypes.bfloat16)
    assert bf16.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(bf16.astype(np.float32), f32)


def test_format_errors_name_the_tensor():
    blocks = np.zeros((2, 3, 4, 16), np.uint8)
    with pytest.raises(Mxfp4FormatError, match="down_proj: scales shape"):
        dequantize_experts(blocks, np.zeros((2, 3, 5), np.uint8), name="down_proj")
    with pytest.raises(Mxfp4FormatError, match="uint8"):
        dequantize_experts(blocks.astype(np.int8), np.zeros((2, 3, 4), np.uint8))
    with pytest.raises(Mxfp4FormatError, match="16 bytes"):
        dequantize_experts(np.zeros((2, 3, 4, 8), np.uint8), np.zeros((2, 3, 4), np.uint8))


@pytest.mark.hf
def test_matches_transformers_convert_moe_packed_tensors():
    import torch
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    rng = np.random.default_rng(2)
    blocks, scales = _random_mxfp4(rng, (3, 8), 2, scale_lo=0, scale_hi=256)
    want = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32)
    np.testing.assert_array_equal(dequantize_experts(blocks, scales), want.numpy())
