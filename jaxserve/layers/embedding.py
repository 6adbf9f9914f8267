"""Token embedding with optional sqrt(hidden) scaling (Gemma) and a tied/untied LM head."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx


class Embedding(nnx.Module):
    """`ids [T] int -> [T, hidden]`; parameter `embedding [vocab, hidden]`.

    With `scale_by_sqrt_dim`, outputs are multiplied by sqrt(hidden) rounded to the parameter dtype first
    (Gemma's normaliser is a dtype-cast constant, which matters in bf16).
    """

    def __init__(self, vocab_size: int, hidden_size: int, *, scale_by_sqrt_dim: bool = False,
                 dtype: jnp.dtype = jnp.float32, rngs: nnx.Rngs):
        self.embed = nnx.Embed(vocab_size, hidden_size, dtype=dtype, param_dtype=dtype, rngs=rngs)
        self.scale = math.sqrt(hidden_size) if scale_by_sqrt_dim else None
        self.dtype = dtype

    def __call__(self, ids: jax.Array) -> jax.Array:
        x = self.embed(ids)
        if self.scale is not None:
            x = x * jnp.asarray(self.scale, self.dtype)
        return x

    def attend(self, x: jax.Array) -> jax.Array:
        """Tied LM head: `x [T, hidden] -> [T, vocab]` against the embedding matrix."""
        return self.embed.attend(x)


def soft_cap(x: jax.Array, cap: float | None) -> jax.Array:
    """`cap * tanh(x / cap)`, or `x` when `cap` is None (Gemma 2 attention and final logits)."""
    if cap is None:
        return x
    return cap * jnp.tanh(x / cap)
