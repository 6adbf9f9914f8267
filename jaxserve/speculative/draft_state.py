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


def extend_and_store(draft: Eagle3Draft, ids: jax.Array, hidden_in: jax.Array, meta, dpool, emb: jax.Array,
                     states: DraftStates, dest: jax.Array, last_idx: jax.Array, *, topk: int, record: bool):
    """Run the draft over a span (writing its KV), store the state at rows `last_idx` of the span into
    buffer rows `dest`. Returns (dpool, states, top1): `top1 i32[T]`, the draft's argmax at every position,
    only when `record` (diagnostics: the lm_head then runs over all T positions, not just `last_idx`)."""
    if record:
        logits, hidden, dpool = draft(ids, hidden_in, meta, dpool, emb, return_all_logits=True)
        last_logits, top1 = logits[last_idx], greedy_ids(draft, logits)
        last = hidden[last_idx]
    else:  # the layer runs over the stored rows only (every token's K/V is written)
        last, dpool = draft.extend(ids, hidden_in, meta, dpool, emb, last_idx)
        last_logits, top1 = draft.logits(last), None
    states = store(states, dest, (*best_next(draft, last_logits, topk), last))
    return dpool, states, top1
