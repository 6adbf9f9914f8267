"""The plain step cut in two programs, for batches with a grammar under the overlap schedule.

A grammar row's mask for step t+1 depends on the token step t sampled, which reaches the host only once
step t has run; but the mask is needed only when step t+1 samples, after its forward. So a constrained
step can run as two dispatches (`ModelRunner.run_forward` and `run_sample`): `forward` (the model: logits
of every sampling row, KV written, the pending tokens read on device from the previous step's samples)
and `sample` (the sampler over those logits, with the masks as data). The stepper dispatches the forward
of step t+1, then reads and applies step t while the device runs it, fills the masks, and dispatches the
sample.

Both programs compute what the fused step (`runner._make_step`) computes, in the same order: the same
logits, the same sampler and keys, the same penalty updates. The KV pools are donated to `forward` and the
penalty pool to `sample`, as in the fused step. One `forward` executable per step bucket and one `sample`
executable per sequence bucket (with a mask), compiled on first use.

Guessed masks (`guessed_fn`): most grammar states repeat their mask from one token to the next (a regex
loop, the inside of a JSON string). When every constrained row's mask is a guess the stepper trusts (see
`engine.stepper`), both halves run as one program, `guessed`, sampling with the guessed masks and also
returning the logits; once the step before is applied and the true masks are filled, a wrong guess is
redone by `sample` over those logits (same keys, so the same draw as the split step), a right one costs
no second dispatch. Only for batches without penalty rows: the redo would count a row's token twice.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxserve.engine.step_input import pad_meta, pad_sampling, pad_to
from jaxserve.sampling import PenaltyPool, SamplingBatch, sample, update_counts


def _forward(graphdef, params, kv_pools, prev_tokens: jax.Array, input_ids, prev_rows, meta) -> tuple:
    model = nnx.merge(graphdef, params)
    input_ids = jnp.where(prev_rows >= 0, prev_tokens[jnp.maximum(prev_rows, 0)], input_ids)
    logits, kv_pools, _ = model(input_ids, meta, kv_pools)
    return kv_pools, logits


def _sample(max_seqs: int, logits: jax.Array, sampling: SamplingBatch, penalties: PenaltyPool) -> tuple:
    out = sample(logits, sampling, penalties)
    penalties = update_counts(penalties, sampling.penalty_rows, out.token_ids)
    next_tokens = jnp.zeros(max_seqs, jnp.int32).at[: out.token_ids.shape[0]].set(out.token_ids)
    return penalties, next_tokens, out


def split_fns(graphdef, max_seqs: int) -> tuple:
    """The jitted (forward, sample) halves of one model graph; `ModelRunner` wraps them in `Programs` once
    per graph and owns the state they read and replace."""

    @functools.partial(jax.jit, donate_argnames=("kv_pools",))
    def forward(params, kv_pools, prev_tokens: jax.Array, input_ids, prev_rows, meta):
        return _forward(graphdef, params, kv_pools, prev_tokens, input_ids, prev_rows, meta)

    @functools.partial(jax.jit, donate_argnames=("penalties",))
    def sample_step(logits: jax.Array, sampling: SamplingBatch, penalties: PenaltyPool):
        return _sample(max_seqs, logits, sampling, penalties)

    return forward, sample_step


def guessed_fn(graphdef, max_seqs: int):
    """The jitted `guessed` program: `forward` then `sample` in one dispatch, returning (kv_pools,
    penalties, next_tokens, samples, logits); the KV and penalty pools are donated."""

    @functools.partial(jax.jit, donate_argnames=("kv_pools", "penalties"))
    def guessed(params, kv_pools, penalties: PenaltyPool, prev_tokens: jax.Array, input_ids, prev_rows, meta,
                sampling: SamplingBatch):
        kv_pools, logits = _forward(graphdef, params, kv_pools, prev_tokens, input_ids, prev_rows, meta)
        penalties, next_tokens, out = _sample(max_seqs, logits, sampling, penalties)
        return kv_pools, penalties, next_tokens, out, logits

    return guessed


def repad_forward(args: tuple, bucket: tuple[int, int, int]) -> tuple:
    t, s, p = bucket
    return (*args[:3], pad_to(args[3], (t,)), pad_to(args[4], (t,), -1), pad_meta(args[5], t, s, p))


def repad_guessed(args: tuple, bucket: tuple[int, int, int]) -> tuple:
    t, s, p = bucket
    return (*args[:4], pad_to(args[4], (t,)), pad_to(args[5], (t,), -1), pad_meta(args[6], t, s, p),
            pad_sampling(args[7], s))


def repad_sample(args: tuple, bucket: tuple[int]) -> tuple:
    logits, sampling, penalties = args
    rows = bucket[0]
    return (jnp.pad(logits, ((0, rows - logits.shape[0]), (0, 0))), pad_sampling(sampling, rows), penalties)


def fill_masks(sampling: SamplingBatch, masks: np.ndarray | None) -> SamplingBatch:
    """`sampling` with `masks` (u32[R, W], R <= rows, or None: no row has a grammar) as its token bitmask;
    rows past R allow every token. A mask of all the batch's rows (`fill_bitmask(..., sampling.num_rows)`)
    is taken as it is, without a copy."""
    if masks is None:
        return sampling
    if masks.shape[0] != sampling.num_rows:
        full = np.full((sampling.num_rows, masks.shape[1]), 0xFFFFFFFF, np.uint32)
        full[: masks.shape[0]] = masks
        masks = full
    return dataclasses.replace(sampling, token_bitmask=masks)
