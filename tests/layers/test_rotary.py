"""Rotary schedules and rotation vs transformers' own rope functions."""

import numpy as np
import pytest

from jaxserve.layers.rotary import RopeParams, RotaryEmbedding, compute_inv_freq

pytestmark = [pytest.mark.hf, pytest.mark.slow]


HEAD_DIM = 64
CASES = {
    "default": dict(rope_type="default", rope_theta=10000.0),
    "linear": dict(rope_type="linear", rope_theta=10000.0, factor=4.0),
    "llama3": dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                   high_freq_factor=4.0, original_max_position_embeddings=8192),
    # gpt-oss: truncate false, concentration 0.1 ln 32 + 1 on cos and sin
    "yarn_gpt_oss": dict(rope_type="yarn", rope_theta=150000.0, factor=32.0, beta_fast=32.0, beta_slow=1.0,
                         original_max_position_embeddings=4096, truncate=False),
    "yarn_truncated": dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                           original_max_position_embeddings=2048),
}


def _ours(params: dict) -> RopeParams:
    kwargs = {k: v for k, v in params.items() if k not in ("rope_type", "rope_theta")}
    return RopeParams(rope_type=params["rope_type"], theta=params["rope_theta"], **kwargs)


def _hf(params: dict):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(hidden_size=HEAD_DIM * 4, num_attention_heads=4, head_dim=HEAD_DIM,
                         max_position_embeddings=131072, rope_parameters=dict(params))
    if params["rope_type"] == "default":
        base = params["rope_theta"]
        return 1.0 / base ** (np.arange(0, HEAD_DIM, 2) / HEAD_DIM), 1.0
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, "cpu")
    return inv_freq.numpy(), scaling


@pytest.mark.parametrize("case", sorted(CASES))
def test_inverse_frequencies_and_scaling_match_transformers(case):
    ours, scaling = compute_inv_freq(_ours(CASES[case]), HEAD_DIM, 131072)
    want, want_scaling = _hf(CASES[case])
    np.testing.assert_allclose(ours, want, rtol=2e-6)
    assert scaling == pytest.approx(want_scaling, rel=1e-9)
    if case == "yarn_gpt_oss":
        assert scaling == pytest.approx(0.1 * np.log(32) + 1)


@pytest.mark.parametrize("case", ["llama3", "yarn_gpt_oss"])
def test_rotation_matches_transformers_apply_rotary_pos_emb(case):
    import torch
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    rope = RotaryEmbedding.from_params(_ours(CASES[case]), HEAD_DIM, 131072)
    # same float32 frequencies on both sides (checked above to rtol 2e-6): at position 70000 a 1-ulp
    # frequency difference alone moves the angle by ~4e-3, which would hide what this test checks
    inv_freq, scaling = np.asarray(rope.inv_freq, np.float32), _hf(CASES[case])[1]
    rng = np.random.RandomState(0)
    q = rng.randn(7, 3, HEAD_DIM).astype(np.float32)
    positions = np.array([0, 1, 5, 100, 4095, 9000, 70000], np.int32)
    freqs = positions[:, None].astype(np.float32) * inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], -1)
    cos, sin = torch.tensor(np.cos(emb) * scaling), torch.tensor(np.sin(emb) * scaling)
    qt = torch.tensor(q).transpose(0, 1)[None]  # [1, heads, T, D]
    want, _ = apply_rotary_pos_emb(qt, qt, cos[None], sin[None])
    got = np.asarray(rope(q, positions))
    np.testing.assert_allclose(got, want[0].transpose(0, 1).numpy(), atol=5e-5)


def test_partial_rotary_leaves_the_tail_unrotated():
    rope = RotaryEmbedding.from_params(RopeParams(partial_rotary_factor=0.5), 16)
    x = np.random.RandomState(1).randn(4, 2, 16).astype(np.float32)
    out = np.asarray(rope(x, np.array([0, 3, 9, 20], np.int32)))
    np.testing.assert_array_equal(out[..., 8:], x[..., 8:])
    assert not np.allclose(out[1:, :, :8], x[1:, :, :8])


def test_missing_schedule_parameter_is_named():
    with pytest.raises(ValueError, match="low_freq_factor"):
        RopeParams(rope_type="llama3", factor=8.0, high_freq_factor=4.0, original_max_position_embeddings=8)
    with pytest.raises(ValueError, match="dynamic"):
        RopeParams(rope_type="dynamic")
