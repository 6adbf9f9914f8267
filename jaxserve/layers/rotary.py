"""Rotary position embeddings: default, linear, llama3 and YaRN frequency schedules, NeoX half-split rotation.

Frequencies are computed once on the host (float64 numpy, stored as float32) from `RopeParams`; a model with
per-layer-type bases (Gemma 3 local/global) builds one `RotaryEmbedding` per layer type.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclasses.dataclass(frozen=True)
class RopeParams:
    """One rotary schedule, as HF writes it in `rope_parameters` (or `rope_scaling` + `rope_theta`).

    `factor` etc. are only read by the schedules that use them; `partial_rotary_factor` < 1 rotates only the
    first `int(head_dim * partial_rotary_factor)` features of each head.
    """

    rope_type: str = "default"
    theta: float = 10000.0
    factor: float | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    original_max_position_embeddings: int | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True
    partial_rotary_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"rope_type {self.rope_type!r} is not supported; supported: {ROPE_TYPES}")
        needs = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                                                    "original_max_position_embeddings"),
                 "yarn": ("factor", "original_max_position_embeddings")}.get(self.rope_type, ())
        for name in needs:
            if getattr(self, name) is None:
                raise ValueError(f"rope_type {self.rope_type!r} needs rope parameter {name!r}")


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def compute_inv_freq(params: RopeParams, head_dim: int,
                     max_position_embeddings: int | None = None) -> tuple[np.ndarray, float]:
    """Return `(inv_freq [rot_dim/2] float64, attention_scaling)` for one schedule.

    `attention_scaling` multiplies cos and sin (YaRN concentration; 1.0 otherwise).
    """
    dim = int(head_dim * params.partial_rotary_factor)
    base = params.theta
    inv_freq = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    kind = params.rope_type
    if kind == "default":
        return inv_freq, 1.0
    if kind == "linear":
        return inv_freq / params.factor, 1.0
    if kind == "llama3":
        return _llama3(inv_freq, params), 1.0
    return _yarn(params, dim, max_position_embeddings)


def _llama3(inv_freq: np.ndarray, p: RopeParams) -> np.ndarray:
    old_ctx = p.original_max_position_embeddings
    low_wavelen = old_ctx / p.low_freq_factor
    high_wavelen = old_ctx / p.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / p.factor, inv_freq)
    smooth = (old_ctx / wavelen - p.low_freq_factor) / (p.high_freq_factor - p.low_freq_factor)
    smoothed = (1 - smooth) * scaled / p.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled)


def _yarn(p: RopeParams, dim: int, max_position_embeddings: int | None) -> tuple[np.ndarray, float]:
    factor = p.factor
    if factor is None:  # DeepSeek-style configs derive it from the context extension
        factor = max_position_embeddings / p.original_max_position_embeddings
    attention_factor = p.attention_factor
    if attention_factor is None:
        if p.mscale and p.mscale_all_dim:
            attention_factor = _yarn_mscale(factor, p.mscale) / _yarn_mscale(factor, p.mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)
    beta_fast = p.beta_fast or 32.0
    beta_slow = p.beta_slow or 1.0

    def correction_dim(num_rotations: float) -> float:
        ctx = p.original_max_position_embeddings
        return dim * math.log(ctx / (num_rotations * 2 * math.pi)) / (2 * math.log(p.theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    extrapolation = 1.0 - ramp  # 1 = keep the original frequency (high-frequency dims)
    pos_freqs = p.theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention_factor)


@dataclasses.dataclass(frozen=True)
class RotaryEmbedding:
    """Static rotary table for one head size and schedule (hashable: safe as a static module attribute)."""

    inv_freq: tuple[float, ...]
    attention_scaling: float = 1.0

    @classmethod
    def from_params(cls, params: RopeParams, head_dim: int,
                    max_position_embeddings: int | None = None) -> RotaryEmbedding:
        inv_freq, scaling = compute_inv_freq(params, head_dim, max_position_embeddings)
        return cls(tuple(float(f) for f in inv_freq.astype(np.float32)), float(scaling))

    @property
    def rotary_dim(self) -> int:
        return 2 * len(self.inv_freq)

    def __call__(self, x: jax.Array, positions: jax.Array) -> jax.Array:
        """Rotate `x [T, heads, head_dim]` at int `positions [T]` (NeoX half-split); same shape and dtype.

        Features past `rotary_dim` (partial rotary) pass through unchanged.
        """
        inv_freq = jnp.asarray(self.inv_freq, jnp.float32)
        freqs = positions.astype(jnp.float32)[:, None] * inv_freq[None, :]
        emb = jnp.concatenate([freqs, freqs], axis=-1)[:, None, :]  # [T, 1, rot_dim]
        cos = (jnp.cos(emb) * self.attention_scaling).astype(x.dtype)
        sin = (jnp.sin(emb) * self.attention_scaling).astype(x.dtype)
        rot, rest = x[..., : self.rotary_dim], x[..., self.rotary_dim:]
        half = self.rotary_dim // 2
        rotated = jnp.concatenate([-rot[..., half:], rot[..., :half]], axis=-1)
        out = rot * cos + rotated * sin
        return jnp.concatenate([out, rest], axis=-1) if rest.shape[-1] else out
