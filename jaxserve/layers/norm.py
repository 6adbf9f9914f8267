"""RMSNorm, computed in float32 whatever the parameter dtype."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


class RMSNorm(nnx.Module):
    """Root-mean-square norm over the last axis.

    `y = x / sqrt(mean(x^2) + eps) * w` with the statistics in float32. With `unit_offset=True` the weight is
    applied as `(1 + w)` in float32 (Gemma); otherwise the normalised value is cast back to the input dtype
    before the multiply (Llama/Qwen/Mistral/gpt-oss, matching transformers). The parameter is `weight [dim]`.
    """

    def __init__(self, dim: int, *, eps: float = 1e-6, unit_offset: bool = False,
                 param_dtype: jnp.dtype = jnp.float32, rngs: nnx.Rngs | None = None):
        del rngs
        init = jnp.zeros if unit_offset else jnp.ones
        self.weight = nnx.Param(init((dim,), param_dtype))
        self.eps = eps
        self.unit_offset = unit_offset

    def __call__(self, x: jax.Array) -> jax.Array:
        in_dtype = x.dtype
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        w = self.weight[...]
        if self.unit_offset:
            return (normed * (1.0 + w.astype(jnp.float32))).astype(in_dtype)
        return w * normed.astype(in_dtype)
