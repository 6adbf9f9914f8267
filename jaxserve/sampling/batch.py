"""`SamplingBatch`: the per-row sampling parameters of one step, built on the host with numpy.

S rows = the step's sequence bucket. Row i belongs to the i-th sequence that samples this step; rows past the
real ones are padding (greedy, no filters, no penalties) whose outputs the caller ignores.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import numpy as np

from jaxserve.memory.host_buffers import aligned_full
from jaxserve.sampling.params import MAX_LOGIT_BIAS, SamplingParams
from jaxserve.sampling.seeds import seed_words

# Row index for rows without a penalty-pool row: no penalties applied, no counts updated (see penalties.py).
_INT32_MAX = int(np.iinfo(np.int32).max)
NO_PENALTY_ROW = _INT32_MAX


@dataclasses.dataclass(frozen=True)
class SamplingRow:
    """One sequence's sampling input for this step (host side).

    seed: resolved seed (`SeedSource.seed_for(params)`), fixed for the request's lifetime.
    num_generated: output tokens generated before this one (0 when sampling the first output token).
    penalty_row: the request's row in the `PenaltyPool`, or None when it has no row.
    """

    params: SamplingParams
    seed: int
    num_generated: int
    penalty_row: int | None = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SamplingBatch:
    """Per-row sampling parameters, S rows (the sequence bucket). A pytree of arrays; no static fields.

    temperatures f32[S] (0 = greedy), top_k i32[S] (-1 = off), top_p f32[S] (1 = off), min_p f32[S] (0 = off)
    (greedy rows always carry the three filters off),
    repetition_penalty / frequency_penalty / presence_penalty f32[S] (1 / 0 / 0 = off),
    seed_words u32[S, 2] (seed as high, low words), num_generated i32[S] (folded into the key),
    penalty_rows i32[S] (row in the PenaltyPool; NO_PENALTY_ROW when none),
    bias_ids i32[S, MAX_LOGIT_BIAS] / bias_values f32[S, MAX_LOGIT_BIAS]: logit_bias entries (padding adds 0
    to token 0), num_top_logprobs i32[S] (top logprobs the row reports; 0 = none),
    token_bitmask u32[S, ceil(V / 32)] or None: bit j of word w allows token 32 w + j (a grammar's mask;
    rows without a grammar allow everything). None when no row has a grammar, so a batch without grammars
    keeps the step's other executable and sends no mask.
    """

    temperatures: np.ndarray | jax.Array
    top_k: np.ndarray | jax.Array
    top_p: np.ndarray | jax.Array
    min_p: np.ndarray | jax.Array
    repetition_penalty: np.ndarray | jax.Array
    frequency_penalty: np.ndarray | jax.Array
    presence_penalty: np.ndarray | jax.Array
    seed_words: np.ndarray | jax.Array
    num_generated: np.ndarray | jax.Array
    penalty_rows: np.ndarray | jax.Array
    bias_ids: np.ndarray | jax.Array
    bias_values: np.ndarray | jax.Array
    num_top_logprobs: np.ndarray | jax.Array
    token_bitmask: np.ndarray | jax.Array | None = None

    @property
    def num_rows(self) -> int:
        """S, the padded number of rows."""
        return int(self.temperatures.shape[0])


def build_sampling_batch(rows: Sequence[SamplingRow], num_rows: int,
                         token_bitmask: np.ndarray | None = None, *, repeat: int = 1) -> SamplingBatch:
    """Pack `rows` into a SamplingBatch of `num_rows` rows (the bucket), padding the rest. O(num_rows).
    `repeat`: each of `rows` fills that many consecutive rows (a speculative round samples every verified
    node of a request with the request's row). `token_bitmask` (u32[R, W] with R <= the filled rows or
    R == num_rows, or None): the first R rows' grammar masks; the other rows allow every token. A mask of
    `num_rows` rows is the batch's own (not copied).

    Raises ValueError if the filled rows exceed `num_rows`, a row has num_generated < 0, or a row uses
    penalties without a penalty_row.
    """
    filled = len(rows) * repeat
    if filled > num_rows:
        raise ValueError(f"{filled} sampling rows do not fit the bucket of {num_rows} rows")
    # one (rows, 8) array of each request's cached values (`SamplingParams.sampler_values`): float64 holds
    # every int32 exactly and rounds each float to float32 as a direct conversion would
    fixed = np.array([row.params.sampler_values for row in rows], np.float64).reshape(len(rows), 8)
    num_generated = np.fromiter((row.num_generated for row in rows), np.int64, len(rows))
    penalty_rows = np.fromiter((NO_PENALTY_ROW if row.penalty_row is None else row.penalty_row
                                for row in rows), np.int64, len(rows))
    if (num_generated < 0).any():
        raise ValueError("num_generated must be >= 0 for every sampling row")
    uses_penalties = (fixed[:, 4] != 1.0) | (fixed[:, 5] != 0.0) | (fixed[:, 6] != 0.0)
    if (uses_penalties & (penalty_rows == NO_PENALTY_ROW)).any():
        raise ValueError("a row uses repetition/frequency/presence penalties but has no penalty_row")

    def column(values: np.ndarray, pad, dtype) -> np.ndarray:
        out = np.full(num_rows, pad, dtype=dtype)
        if rows:
            values = values.astype(dtype)
            out[:filled] = np.repeat(values, repeat) if repeat > 1 else values
        return out

    words = np.zeros((num_rows, 2), dtype=np.uint32)
    if rows:
        words[:filled] = np.repeat(seed_words([row.seed for row in rows]), repeat, axis=0)
    bias_ids = np.zeros((num_rows, MAX_LOGIT_BIAS), np.int32)
    bias_values = np.zeros((num_rows, MAX_LOGIT_BIAS), np.float32)
    for i, row in enumerate(rows):
        if row.params.logit_bias:
            ids, values = zip(*row.params.logit_bias, strict=True)
            span = slice(i * repeat, (i + 1) * repeat)
            bias_ids[span, : len(ids)], bias_values[span, : len(ids)] = ids, values
    if token_bitmask is not None and token_bitmask.shape[0] != num_rows:
        mask = aligned_full((num_rows, token_bitmask.shape[1]), 0xFFFFFFFF, np.uint32)
        mask[: token_bitmask.shape[0]] = token_bitmask
        token_bitmask = mask
    return SamplingBatch(
        temperatures=column(fixed[:, 0], 0.0, np.float32),
        top_k=column(fixed[:, 1], -1, np.int32),
        top_p=column(fixed[:, 2], 1.0, np.float32),
        min_p=column(fixed[:, 3], 0.0, np.float32),
        repetition_penalty=column(fixed[:, 4], 1.0, np.float32),
        frequency_penalty=column(fixed[:, 5], 0.0, np.float32),
        presence_penalty=column(fixed[:, 6], 0.0, np.float32),
        seed_words=words,
        num_generated=column(num_generated, 0, np.int32),
        penalty_rows=column(penalty_rows, NO_PENALTY_ROW, np.int32),
        bias_ids=bias_ids,
        bias_values=bias_values,
        num_top_logprobs=column(fixed[:, 7], 0, np.int32),
        token_bitmask=token_bitmask,
    )
