"""Verification of a drafted chain: greedy matching, or exact rejection sampling for sampled requests.

The chain's drafts come from the draft's argmax, so the proposal distribution at each position is a point
mass on the drafted token d. Speculative sampling with such a proposal accepts d with probability
min(1, p(d) / 1) = p(d), where p is the target's distribution after the request's temperature and top-k /
top-p / min-p filters; after a rejection the token is drawn from the residual max(p - q, 0), normalised,
which here is p with d removed. The first rejected position ends the round; if every draft is accepted the
position after the last draft yields a bonus token drawn from p. The result is distributed exactly as
sampling from the target token by token. Greedy rows (temperature 0) accept d iff it is the target's argmax,
and the correction is the argmax.

Randomness: position j of a request verifying after `g` generated tokens uses the key of output index
`g + j` (the same seed scheme as `jaxserve.sampling`), split in two for the accept test and the residual
draw; a round consumes keys only up to its first rejection, and the next round starts after it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxserve.sampling.batch import SamplingBatch
from jaxserve.sampling.filters import apply_filters
from jaxserve.sampling.sampler import row_keys


def verify_tokens(logits: jax.Array, proposed: jax.Array,
                  batch: SamplingBatch) -> tuple[jax.Array, jax.Array]:
    """`logits f32[T, V]` of the verified positions, `proposed i32[T]` the draft token each position tests
    (-1: none, the bonus position), `batch` one row per position. Returns `accept bool[T]` and
    `correction i32[T]` (the token to emit at the first rejected position, or the bonus token)."""
    greedy = batch.temperatures == 0.0
    temperatures = jnp.where(greedy, 1.0, batch.temperatures)
    filtered = apply_filters(logits / temperatures[:, None], batch.top_k, batch.top_p, batch.min_p)
    probs = jax.nn.softmax(filtered, axis=-1)
    vocab = logits.shape[-1]
    has_draft = proposed >= 0
    draft = jnp.maximum(proposed, 0)
    p_draft = jnp.where(has_draft, jnp.take_along_axis(probs, draft[:, None], axis=-1)[:, 0], 0.0)
    keys = jax.vmap(lambda k: jax.random.split(k, 2))(row_keys(batch))
    uniform = jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(keys[:, 0])
    gumbel = jax.vmap(lambda k: jax.random.gumbel(k, (vocab,), jnp.float32))(keys[:, 1])
    removed = has_draft[:, None] & (jnp.arange(vocab)[None, :] == draft[:, None])
    residual = jnp.where(removed | (probs <= 0), -jnp.inf, jnp.log(jnp.maximum(probs, 1e-38)))
    target_argmax = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    accept = jnp.where(greedy, has_draft & (proposed == target_argmax), has_draft & (uniform < p_draft))
    drawn = jnp.argmax(residual + gumbel, axis=-1).astype(jnp.int32)
    return accept, jnp.where(greedy, target_argmax, drawn)
