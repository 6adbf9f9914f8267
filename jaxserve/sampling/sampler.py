"""`sample`: one token per row from a step's logits, fused into the jitted step.

Order per row (HF / SGLang): logit_bias -> penalties -> grammar mask -> temperature -> top-k -> top-p -> min-p
-> Gumbel-max draw. Greedy rows (temperature 0) take the argmax of the masked, penalised logits. No host sync,
no data-dependent Python control flow: one trace per (S, V, logits dtype, pool or None, grammar mask or None,
filter_method).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxserve.sampling.batch import SamplingBatch
from jaxserve.sampling.constraints import apply_logit_bias, apply_token_bitmask
from jaxserve.sampling.filters import FilterMethod, apply_filters
from jaxserve.sampling.logprobs import token_logprobs, top_logprobs
from jaxserve.sampling.penalties import PenaltyPool, apply_penalties


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SampleOutput:
    """token_ids i32[S]: the sampled token per row.
    logprobs f32[S]: log-probability of that token under the model's raw distribution, log_softmax(logits)
    before logit_bias, penalties, temperature, filters and grammar masks (see `logprobs`); padding rows hold
    garbage.
    top_ids i32[S, K] / top_logprobs f32[S, K] (K = MAX_TOP_LOGPROBS): the raw distribution's most likely
    tokens, best first; zeros when no row of the batch asks for them (`num_top_logprobs`).
    """

    token_ids: jax.Array
    logprobs: jax.Array
    top_ids: jax.Array
    top_logprobs: jax.Array


def row_keys(batch: SamplingBatch) -> jax.Array:
    """key[S]: per-row keys fold_in(threefry_key(seed), num_generated) (see seeds.py)."""
    keys = jax.random.wrap_key_data(jnp.asarray(batch.seed_words, jnp.uint32), impl="threefry2x32")
    return jax.vmap(jax.random.fold_in)(keys, jnp.asarray(batch.num_generated, jnp.uint32))


def draw_tokens(penalised: jax.Array, batch: SamplingBatch, *,
                filter_method: FilterMethod = "bisect") -> jax.Array:
    """i32[S]: each row's token from its final logits f32[S, V] (logit_bias, penalties and grammar mask
    applied): the argmax for greedy rows, else the Gumbel-max draw with the row's key (`row_keys`) after
    temperature and filters. A function of the logits, the row's parameters and its key only, so any
    program that calls it on the same logits draws the same token."""
    greedy = batch.temperatures == 0.0
    argmax = jnp.argmax(penalised, axis=-1).astype(jnp.int32)

    def draw() -> jax.Array:
        temperatures = jnp.where(greedy, 1.0, batch.temperatures)
        scaled = penalised / temperatures[:, None]
        filtered = apply_filters(scaled, batch.top_k, batch.top_p, batch.min_p, filter_method)
        vocab_size = penalised.shape[-1]
        gumbel = jax.vmap(lambda key: jax.random.gumbel(key, (vocab_size,), jnp.float32))(row_keys(batch))
        drawn = jnp.argmax(filtered + gumbel, axis=-1)
        return jnp.where(greedy, argmax, drawn).astype(jnp.int32)

    # an all-greedy batch skips the random draws (one [S, V] Gumbel sample per step otherwise)
    return jax.lax.cond(jnp.any(~greedy), draw, lambda: argmax)


def sample(
    logits: jax.Array,
    batch: SamplingBatch,
    penalties: PenaltyPool | None = None,
    *,
    filter_method: FilterMethod = "bisect",
) -> SampleOutput:
    """Sample one token per row. logits [S, V] (any float dtype; computed in f32), batch with S rows.

    penalties: the pool whose rows `batch.penalty_rows` hold each request's token counts, or None to skip
    penalties entirely (then the batch's penalty parameters are ignored). Pure: the caller updates the pool
    afterwards with `update_counts(pool, batch.penalty_rows, out.token_ids)`. filter_method (static):
    how top-k/top-p cutoffs are found, see filters.py.
    """
    raw = logits.astype(jnp.float32)
    biased = apply_logit_bias(raw, batch)
    penalised = biased if penalties is None else apply_penalties(biased, batch, penalties)
    penalised = apply_token_bitmask(penalised, batch.token_bitmask)

    token_ids = draw_tokens(penalised, batch, filter_method=filter_method)

    logp = jax.nn.log_softmax(raw, axis=-1)
    top_ids, top_lps = top_logprobs(logp, batch.num_top_logprobs)
    return SampleOutput(token_ids=token_ids, logprobs=token_logprobs(logp, token_ids), top_ids=top_ids,
                        top_logprobs=top_lps)
