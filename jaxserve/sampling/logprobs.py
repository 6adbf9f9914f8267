"""Log-probabilities reported to users, computed on device in the step that drew the tokens.

Which distribution: the model's raw one, log_softmax of the logits before logit_bias, penalties,
temperature, top-k / top-p / min-p and grammar masks (what vLLM reports by default, and what OpenAI's
logprobs look like: they do not change with temperature). The sampled token's logprob is reported even when
a filter or a grammar made it far likelier than this distribution says.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxserve.sampling.params import MAX_TOP_LOGPROBS


def token_logprobs(logp: jax.Array, token_ids: jax.Array) -> jax.Array:
    """f32[S]: `logp[s, token_ids[s]]` for log-probabilities `logp` f32[S, V]."""
    return jnp.take_along_axis(logp, token_ids[:, None], axis=-1)[:, 0]


def top_logprobs(logp: jax.Array, num_top: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(ids i32[S, K], logprobs f32[S, K]), K = MAX_TOP_LOGPROBS: each row's most likely tokens, best first
    (a vocabulary smaller than K pads with id 0 at -inf). Skipped (zeros) when no row asks for any (`num_top`
    i32[S] all 0): a top-k over V costs a sort."""
    num_rows, vocab_size = logp.shape

    def compute():
        values, ids = jax.lax.top_k(logp, min(MAX_TOP_LOGPROBS, vocab_size))
        pad = MAX_TOP_LOGPROBS - values.shape[1]
        return (jnp.pad(ids.astype(jnp.int32), ((0, 0), (0, pad))),
                jnp.pad(values, ((0, 0), (0, pad)), constant_values=-jnp.inf))

    def skip():
        return (jnp.zeros((num_rows, MAX_TOP_LOGPROBS), jnp.int32),
                jnp.zeros((num_rows, MAX_TOP_LOGPROBS), jnp.float32))

    return jax.lax.cond(jnp.any(num_top > 0), compute, skip)


def next_token_logprobs(logits: jax.Array, next_ids: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Prompt logprobs from all-positions `logits` f32/bf16[T, V]: (each position's logprob of `next_ids[t]`
    f32[T], top ids i32[T, K], top logprobs f32[T, K]), computed in float32 (see
    `engine.prompt_logprobs`)."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return (token_logprobs(logp, next_ids), *top_logprobs(logp, jnp.ones(logp.shape[0], jnp.int32)))
