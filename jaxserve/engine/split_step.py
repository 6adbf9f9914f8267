"""The plain step cut in two programs, for batches with a grammar under the overlap schedule.

A grammar row's mask for step t+1 depends on the token step t sampled, which reaches the host only once
step t has run; but the mask is needed only when step t+1 samples, after its forward. So a constrained
step can run as two dispatches (`ModelRunner.run_forward` and `run_sample`): `forward` (the model: logits
of every sampling row, KV written, the pending tokens read on device from the previous step's samples)
and `sample` (the sampler over those logits, with the masks as data). The stepper dispatches the forward
of step t+1, then reads and applies step t while the device runs it, and fills the masks; it dispatches
the sample once it has built step t+2, right before step t+2's forward (see `engine.stepper`).

Both programs compute what the fused step (`runner._make_step`) computes, in the same order: the same
logits, the same sampler and keys, the same penalty updates. The KV pools are donated to `forward` and the
penalty pool to `sample`, as in the fused step. One `forward` executable per step bucket and one `sample`
executable per sequence bucket (with a mask), compiled on first use.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxserve.engine.step_input import pad_meta, pad_sampling, pad_to
from jaxserve.memory.host_buffers import aligned_full
from jaxserve.sampling import PenaltyPool, SamplingBatch, sample, update_counts


def split_fns(graphdef, max_seqs: int) -> tuple:
    """The jitted (forward, sample) halves of one model graph; `ModelRunner` wraps them in `Programs` once
    per graph and owns the state they read and replace."""

    @functools.partial(jax.jit, donate_argnames=("kv_pools",))
    def forward(params, kv_pools, prev_tokens: jax.Array, input_ids, prev_rows, meta):
        model = nnx.merge(graphdef, params)
        input_ids = jnp.where(prev_rows >= 0, prev_tokens[jnp.maximum(prev_rows, 0)], input_ids)
        logits, kv_pools, _ = model(input_ids, meta, kv_pools)
        return kv_pools, logits

    @functools.partial(jax.jit, donate_argnames=("penalties",))
    def sample_step(logits: jax.Array, sampling: SamplingBatch, penalties: PenaltyPool):
        out = sample(logits, sampling, penalties)
        penalties = update_counts(penalties, sampling.penalty_rows, out.token_ids)
        next_tokens = jnp.zeros(max_seqs, jnp.int32).at[: out.token_ids.shape[0]].set(out.token_ids)
        return penalties, next_tokens, out

    return forward, sample_step


def repad_forward(args: tuple, bucket: tuple[int, int, int]) -> tuple:
    t, s, p = bucket
    return (*args[:3], pad_to(args[3], (t,)), pad_to(args[4], (t,), -1), pad_meta(args[5], t, s, p))


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
        full = aligned_full((sampling.num_rows, masks.shape[1]), 0xFFFFFFFF, np.uint32)
        full[: masks.shape[0]] = masks
        masks = full
    return dataclasses.replace(sampling, token_bitmask=masks)
