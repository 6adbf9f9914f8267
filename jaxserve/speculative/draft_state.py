"""The per-request draft state a speculative round starts from, kept on device.

For each decoding request, one row of a fixed buffer (rows = the engine's largest sequence bucket) holds
the draft's `topk` best next tokens (target ids), their log-probabilities, and the draft hidden state that
produced them: written by the prefill and by the draft extend at the end of every round, read by the next
round with an index array. Nothing here reaches the host.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxserve.speculative.eagle3_draft import Eagle3Draft

DraftStates = tuple[jax.Array, jax.Array, jax.Array]


def new_states(num_rows: int, topk: int, hidden_size: int, dtype) -> DraftStates:
    """Zeroed buffers: top ids i32[R, K], top log-probabilities f32[R, K], hidden [R, H]."""
    return (jnp.zeros((num_rows, topk), jnp.int32), jnp.zeros((num_rows, topk), jnp.float32),
            jnp.zeros((num_rows, hidden_size), dtype))


def greedy_ids(draft: Eagle3Draft, logits: jax.Array) -> jax.Array:
    """The draft's argmax per row, as target ids."""
    return draft.to_target_ids(jnp.argmax(logits, axis=-1).astype(jnp.int32))


def best_next(draft: Eagle3Draft, logits: jax.Array, topk: int) -> tuple[jax.Array, jax.Array]:
    """The draft's `topk` best tokens per row (target ids) and their log-probabilities."""
    logp, ids = jax.lax.top_k(jax.nn.log_softmax(logits, axis=-1), topk)
    return draft.to_target_ids(ids.astype(jnp.int32)), logp


def store(states: DraftStates, dest: jax.Array, new: DraftStates) -> DraftStates:
    """Write rows of (top ids, top log-probabilities, hidden) at buffer rows `dest` (out of range: dropped,
    the padding rows' destination)."""
    return tuple(buf.at[dest].set(x.astype(buf.dtype), mode="drop")
                 for buf, x in zip(states, new, strict=True))
