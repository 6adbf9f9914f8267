"""Logit edits that come from a request rather than the model: OpenAI's `logit_bias` and a grammar's token
bitmask. Jittable, applied inside the sampling step; both are data (fixed-width arrays), never shapes."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxserve.sampling.batch import SamplingBatch


def apply_logit_bias(logits: jax.Array, batch: SamplingBatch) -> jax.Array:
    """f32[S, V]: `logits` plus each row's logit_bias entries (padding entries add 0 to token 0)."""
    rows = jnp.broadcast_to(jnp.arange(logits.shape[0])[:, None], batch.bias_ids.shape)
    return jnp.asarray(logits).at[rows, batch.bias_ids].add(batch.bias_values)


def allowed_tokens(token_bitmask: jax.Array, vocab_size: int) -> jax.Array:
    """bool[S, vocab_size] from u32[S, W] (bit j of word w allows token 32 w + j; W * 32 >= vocab_size)."""
    bits = jnp.right_shift(token_bitmask.astype(jnp.uint32)[:, :, None], jnp.arange(32, dtype=jnp.uint32))
    return (bits & 1).astype(bool).reshape(token_bitmask.shape[0], -1)[:, :vocab_size]


def apply_token_bitmask(logits: jax.Array, token_bitmask: jax.Array | None) -> jax.Array:
    """`logits` with the tokens a row's grammar forbids set to -inf (unchanged when the mask is None)."""
    if token_bitmask is None:
        return logits
    return jnp.where(allowed_tokens(token_bitmask, logits.shape[-1]), logits, -jnp.inf)
