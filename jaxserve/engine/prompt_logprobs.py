"""Prompt logprobs (`SamplingParams.prompt_logprobs`): each prompt token's log-probability given the tokens
before it, from the logits of the step that computes the token before it - the same forward, no extra pass.

A step with such a request runs the runner's all-positions variant (`ModelRunner.run_with_prompt_logprobs`),
given `next_ids i32[T]`: for a token at position p of a prompt that wants them, the prompt token p + 1
(known on the host: chunks cut anywhere); 0 elsewhere (ignored). The step returns, per token, the raw
log-probability of its next id and the top ones (`jaxserve.sampling.logprobs`); `record` stores them at
position p + 1 of the request (a retracted request recomputing its prompt writes the same values again).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from jaxserve.engine.step_input import ScheduledSeq


def _spans(batch: Sequence[ScheduledSeq]):
    """(seq, first token index in the step, positions p in [start, stop) with a prompt token at p + 1)."""
    t = 0
    for seq in batch:
        req = seq.req
        if req.prompt_logprobs is not None:
            end = min(seq.start + seq.num_tokens, req.prompt_ids.shape[0] - 1)
            if end > seq.start:
                yield seq, t, range(seq.start, end)
        t += seq.num_tokens


def next_token_ids(batch: Sequence[ScheduledSeq], num_tokens: int) -> np.ndarray | None:
    """i32[num_tokens] (the step's padded token count) as described above; None when no sequence of the
    batch computes a position whose next prompt token needs a logprob."""
    spans = list(_spans(batch))
    if not spans:
        return None
    ids = np.zeros(num_tokens, np.int32)
    for seq, t, positions in spans:
        ids[t: t + len(positions)] = seq.req.prompt_ids[positions.start + 1: positions.stop + 1]
    return ids


def record(batch: Sequence[ScheduledSeq], logprobs: np.ndarray, top_ids: np.ndarray,
           top_logprobs: np.ndarray) -> None:
    """Store a step's per-token results (`logprobs f32[T]`, `top_* [T, K]`) in its requests."""
    for seq, t, positions in _spans(batch):
        req, rows = seq.req, slice(t, t + len(positions))
        req.prompt_logprobs[positions.start + 1: positions.stop + 1] = logprobs[rows]
        num_top = req.params.top_logprobs_num
        for p, ids, lps in zip(positions, top_ids[rows], top_logprobs[rows], strict=True):
            req.prompt_top_logprobs[p + 1] = (ids[:num_top].tolist(), lps[:num_top].tolist())
