"""`ModelRunner`: the jitted device step (forward + on-device sampling) and the device state it carries.

One step = `step(params, kv_pools, penalties, inp) -> (kv_pools, penalties, SampleOutput)`: the model writes
this step's K/V into the donated pools and attends through the page tables, then `jaxserve.sampling.sample`
draws one token per sequence row in the same executable, so only `S` token ids and `S` logprobs come back
to the host. The penalty pool (token counts for repetition/frequency/presence penalties, one row per running
request) is donated too. Dispatch is asynchronous: `run` returns device arrays at once; reading them
(`np.asarray`) waits for the step.
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm import tqdm

from jaxserve.engine.kv_cache import KVCache
from jaxserve.engine.step_input import Buckets, StepInput, padding_step_input
from jaxserve.models.decoder import CausalLM
from jaxserve.sampling import PenaltyPool, SampleOutput, new_penalty_pool, sample, update_counts
from jaxserve.sampling.logprobs import token_logprobs, top_logprobs


@functools.lru_cache(maxsize=8)
def _make_step(graphdef, max_seqs: int, prompt_logprobs: bool = False):
    """The jitted step for one model graph; cached so that engines over the same model share executables.
    `prev_tokens` i32[max_seqs] are the previous step's sampled ids (padded), the source of pending tokens;
    the step returns its own ids padded the same way for the next step. `prompt_logprobs`: the variant that
    computes logits at every position and also returns, for `next_ids i32[T]`, each token's raw logprob of
    its next id and the top ones (see `engine.prompt_logprobs`)."""

    @functools.partial(jax.jit, donate_argnames=("kv_pools", "penalties"))
    def step(params, kv_pools, penalties: PenaltyPool, prev_tokens: jax.Array, inp: StepInput, next_ids=None):
        model = nnx.merge(graphdef, params)
        input_ids = jnp.where(inp.prev_rows >= 0, prev_tokens[jnp.maximum(inp.prev_rows, 0)], inp.input_ids)
        logits, kv_pools, _ = model(input_ids, inp.meta, kv_pools, return_all_logits=prompt_logprobs)
        every = logits
        if prompt_logprobs:
            logits = every[inp.meta.sample_idx]
        out = sample(logits, inp.sampling, penalties)
        penalties = update_counts(penalties, inp.sampling.penalty_rows, out.token_ids)
        next_tokens = jnp.zeros(max_seqs, jnp.int32).at[: out.token_ids.shape[0]].set(out.token_ids)
        if not prompt_logprobs:
            return kv_pools, penalties, next_tokens, out
        logp = jax.nn.log_softmax(every.astype(jnp.float32), axis=-1)
        top = top_logprobs(logp, jnp.ones(logp.shape[0], jnp.int32))
        return kv_pools, penalties, next_tokens, (out, (token_logprobs(logp, next_ids), *top))

    return step


@functools.partial(jax.jit, donate_argnames=("penalties",))
def _set_penalty_row(penalties: PenaltyPool, row, prompt_mask, counts) -> PenaltyPool:
    return PenaltyPool(penalties.output_counts.at[row].set(counts),
                       penalties.prompt_mask.at[row].set(prompt_mask))


class ModelRunner:
    """Owns the split model parameters, the jitted step and the penalty pool; steps `kv.pools` in place
    (the pools are donated and replaced by the step's outputs)."""

    def __init__(self, model: CausalLM, kv: KVCache, buckets: Buckets, num_penalty_rows: int) -> None:
        graphdef, self.params = nnx.split(model)
        self.kv = kv
        self.buckets = buckets
        self.vocab_size = int(model.config.vocab_size)
        self.penalties = new_penalty_pool(num_penalty_rows, self.vocab_size)
        max_seqs = max(buckets.seqs)
        self._step = _make_step(graphdef, max_seqs)
        self._prompt_step = _make_step(graphdef, max_seqs, prompt_logprobs=True)
        self._last_tokens = jnp.zeros(max_seqs, jnp.int32)

    def run(self, inp: StepInput) -> SampleOutput:
        """Dispatch one step; returns the sampled ids/logprobs as device arrays (not yet waited for).
        Tokens marked in `inp.prev_rows` are read on device from the previously dispatched step's samples."""
        self.kv.pools, self.penalties, self._last_tokens, out = self._step(
            self.params, self.kv.pools, self.penalties, self._last_tokens, inp)
        return out

    def run_with_prompt_logprobs(self, inp: StepInput, next_ids: np.ndarray) -> tuple[SampleOutput, tuple]:
        """`run` on the all-positions variant: also (logprobs f32[T] of `next_ids`, top ids i32[T, K], top
        logprobs f32[T, K]) as device arrays (see `engine.prompt_logprobs`)."""
        self.kv.pools, self.penalties, self._last_tokens, (out, prompt) = self._prompt_step(
            self.params, self.kv.pools, self.penalties, self._last_tokens, inp, next_ids)
        return out, prompt

    def set_penalty_row(self, row: int, prompt_ids: np.ndarray, output_ids: list[int]) -> None:
        """Give penalty row `row` to a request: prompt tokens marked, output tokens counted (also after a
        retraction, so counts survive recomputation)."""
        mask = np.zeros(self.vocab_size, bool)
        mask[np.asarray(prompt_ids, np.int64)] = True
        counts = np.bincount(np.asarray(output_ids, np.int64), minlength=self.vocab_size).astype(np.int32)
        self.penalties = _set_penalty_row(self.penalties, jnp.int32(row), mask, counts)

    @property
    def num_compiles(self) -> int:
        """Distinct executables of the step so far (one per bucket shape used, and per shape used by a
        step with prompt logprobs)."""
        return self._step._cache_size() + self._prompt_step._cache_size()

    def warmup(self, *, progress: bool = True) -> int:
        """Compile every bucket shape (seqs <= tokens) with all-padding inputs (they write only the reserved
        slot 0). Returns the number of shapes. Cost: one compile per shape."""
        b = self.buckets
        shapes = [(t, s, p) for t, s, p in itertools.product(b.tokens, b.seqs, b.pages) if s <= t]
        for t, s, p in tqdm(shapes, desc="compiling step buckets", unit="shape", disable=not progress):
            out = self.run(padding_step_input(self.kv, t, s, p))
        jax.block_until_ready(out.token_ids)
        return len(shapes)
