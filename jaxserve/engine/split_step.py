"""The plain step cut in two programs, for batches with a grammar under the overlap schedule.

A grammar row's mask for step t+1 depends on the token step t sampled, which reaches the host only once
step t has run; but the mask is needed only when step t+1 samples, after its forward. `SplitStep`
therefore runs a constrained step as two dispatches: `forward` (the model: logits of every sampling row,
KV written, the pending tokens read on device from the previous step's samples) and `sample` (the
sampler over those logits, with the masks as data). The stepper dispatches the forward of step t+1, then
reads and applies step t while the device runs it, fills the masks, and dispatches the sample.

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

from jaxserve.engine.runner import ModelRunner, Programs
from jaxserve.engine.step_input import StepInput, pad_meta, pad_sampling, pad_to, step_bucket
from jaxserve.sampling import PenaltyPool, SampleOutput, SamplingBatch, sample, update_counts


@functools.lru_cache(maxsize=8)
def _make_split(graphdef, max_seqs: int) -> tuple[Programs, Programs]:
    """(forward, sample) programs of one model graph (cached, so engines over one model share them)."""

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

    return Programs(forward, "split_forward"), Programs(sample_step, "split_sample")


def _repad_forward(args: tuple, bucket: tuple[int, int, int]) -> tuple:
    t, s, p = bucket
    return (*args[:3], pad_to(args[3], (t,)), pad_to(args[4], (t,), -1), pad_meta(args[5], t, s, p))


def _repad_sample(args: tuple, bucket: tuple[int]) -> tuple:
    logits, sampling, penalties = args
    rows = bucket[0]
    return (jnp.pad(logits, ((0, rows - logits.shape[0]), (0, 0))), pad_sampling(sampling, rows), penalties)


class SplitStep:
    """The two halves of `runner`'s plain step; they read and replace the runner's KV pools, penalty pool
    and previous samples exactly as `ModelRunner.run` does."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self._forward, self._sample = _make_split(runner.graphdef, runner._last_tokens.shape[0])

    def forward(self, inp: StepInput) -> jax.Array:
        """Dispatch the model over `inp` (its sampling rows are not read); returns the logits f32/bf16[S', V]
        (S' >= the input's rows when it ran padded to a larger bucket), not waited for."""
        r = self.runner
        r.kv.pools, logits = self._forward.call(
            step_bucket(inp), (r.params, r.kv.pools, r._last_tokens, inp.input_ids, inp.prev_rows, inp.meta),
            _repad_forward)
        return logits

    def sample(self, logits: jax.Array, sampling: SamplingBatch) -> SampleOutput:
        """Dispatch the sampler over `forward`'s logits with `sampling` (its masks filled now); returns the
        samples of `sampling`'s rows as device arrays."""
        r = self.runner
        rows = sampling.num_rows
        sampling = pad_sampling(sampling, logits.shape[0])
        r.penalties, r._last_tokens, out = self._sample.call(
            (logits.shape[0],), (logits, sampling, r.penalties), _repad_sample)
        if logits.shape[0] == rows:
            return out
        return SampleOutput(*(x[:rows] for x in (out.token_ids, out.logprobs, out.top_ids, out.top_logprobs)))

    @property
    def num_compiles(self) -> int:
        """Executables of both halves requested so far."""
        return self._forward.num_compiles + self._sample.num_compiles


def fill_masks(sampling: SamplingBatch, masks: np.ndarray | None) -> SamplingBatch:
    """`sampling` with `masks` (u32[R, W], R <= rows, or None: no row has a grammar) as its token bitmask;
    rows past R allow every token."""
    if masks is None:
        return sampling
    full = np.full((sampling.num_rows, masks.shape[1]), 0xFFFFFFFF, np.uint32)
    full[: masks.shape[0]] = masks
    return dataclasses.replace(sampling, token_bitmask=full)
