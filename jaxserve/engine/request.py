"""`Request`: one generation request on the host, from submission to finish.

A request's tokens are `prompt_ids + output_ids + num_pending` tokens sampled on device but not read back yet
(at most one per step in flight; the overlap schedule feeds them to the next step straight from the device).
`num_computed` of them have KV in the pool, or are being computed by a dispatched step (at
`cached.kv_slots[:num_computed]`); the rest are fed in the next steps. A decoding request has
`num_computed == fill_len - 1` (a decode feeds that one token). Retraction keeps the known output: the request
comes back with a longer "prompt" to recompute, minus whatever prefix the tree still has.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import numpy as np

from cache import CachedReq
from jaxserve.sampling import SamplingParams, StopChecker
from jaxserve.sampling.grammar import GrammarState


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass(eq=False)
class Request:
    """Host state of a request. `cached` is the prefix cache's view (slots, lock); `stop` owns the output
    ids, the text and the finish reason. `max_new_tokens` is the effective cap (clamped to the context)."""

    rid: str
    prompt_ids: np.ndarray
    params: SamplingParams
    seed: int
    max_new_tokens: int
    stop: StopChecker
    cached: CachedReq
    status: Status = Status.WAITING
    num_computed: int = 0
    num_pending: int = 0
    cached_tokens: int = 0
    num_retractions: int = 0
    penalty_row: int | None = None
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[tuple[list[int], list[float]]] = field(default_factory=list)  # per output token
    # params.prompt_logprobs: per prompt position, the token's logprob given the ones before (NaN at 0 and
    # until computed) and its top (ids, logprobs); written by `prompt_logprobs.record`
    prompt_logprobs: np.ndarray | None = None
    prompt_top_logprobs: list[tuple[list[int], list[float]]] | None = None
    arrival_time: float = field(default_factory=time.perf_counter)
    finish_time: float | None = None
    spec_accept_lengths: list[int] | None = None  # speculative decoding: drafts accepted per verify round
    grammar: GrammarState | None = None  # the output constraint's state (json_schema / regex / ebnf)
    # prompt + output, append-only: `fill_ids()` views it, so a step's host cost does not grow with context
    _tokens: np.ndarray | None = field(default=None, repr=False)
    _num_tokens: int = field(default=0, repr=False)

    @property
    def output_ids(self) -> list[int]:
        return self.stop.output_ids

    @property
    def fill_len(self) -> int:
        """prompt + output + pending tokens."""
        return int(self.prompt_ids.shape[0]) + len(self.stop.output_ids) + self.num_pending

    def fill_ids(self) -> np.ndarray:
        """prompt + output as a read-only int32 view of the request's append-only token buffer (pending
        tokens are not known on the host yet). Costs O(tokens appended since the last call), not O(context);
        the view stays valid (outputs are only ever appended)."""
        if self._tokens is None:
            self._tokens = np.empty(int(self.prompt_ids.shape[0]) + max(self.max_new_tokens, 1), np.int32)
            self._tokens[: self.prompt_ids.shape[0]] = self.prompt_ids
            self._num_tokens = int(self.prompt_ids.shape[0])
        out = self.stop.output_ids
        num_tokens = int(self.prompt_ids.shape[0]) + len(out)
        if num_tokens > self._num_tokens:
            if num_tokens > self._tokens.shape[0]:  # past max_new_tokens (never happens; stay correct)
                self._tokens = np.concatenate([self._tokens, np.empty_like(self._tokens)])
            self._tokens[self._num_tokens: num_tokens] = out[self._num_tokens - self.prompt_ids.shape[0]:]
            self._num_tokens = num_tokens
        view = self._tokens[:num_tokens]
        view.flags.writeable = False
        return view

    @property
    def num_remaining(self) -> int:
        """Tokens to feed before the next sample (1 for a decoding request)."""
        return self.fill_len - self.num_computed

    @property
    def last_token_in_flight(self) -> bool:
        """max_new_tokens is reached once the pending tokens are read: nothing more to schedule."""
        return len(self.stop.output_ids) + self.num_pending >= self.max_new_tokens

    @property
    def finished(self) -> bool:
        return self.status in (Status.FINISHED, Status.ABORTED)

    def append_output(self, token_id: int, logprob: float, top_ids=(), top_logprobs=()) -> dict | None:
        """Take one sampled token: record its logprobs, advance the grammar, apply the stop rules. Returns
        the finish reason when the token ends the request."""
        self.record_logprob(logprob, top_ids, top_logprobs)
        if self.grammar is not None:
            self.grammar.advance(token_id)
        return self.stop.append(token_id)

    def record_logprob(self, logprob: float, top_ids, top_logprobs) -> None:
        """Keep the logprob of the output token about to be appended and, when the request asks for
        `top_logprobs_num` of them, the first ones of `top_ids` / `top_logprobs` (best first)."""
        self.logprobs.append(logprob)
        num_top = self.params.top_logprobs_num
        if num_top:
            self.top_logprobs.append(([int(i) for i in top_ids[:num_top]],
                                      [float(v) for v in top_logprobs[:num_top]]))

    def finish_reason(self) -> dict | None:
        if self.status is Status.ABORTED:
            return {"type": "abort", "message": "aborted by the caller"}
        return self.stop.finish_reason

    def meta_info(self) -> dict:
        """SGLang-style meta_info: token counts, `cached_tokens` (prompt tokens reused from the prefix cache
        at the first admission), the finish reason and e2e_latency (seconds since submission)."""
        end = self.finish_time if self.finish_time is not None else time.perf_counter()
        info = {
            "id": self.rid,
            "prompt_tokens": int(self.prompt_ids.shape[0]),
            "completion_tokens": len(self.stop.output_ids),
            "cached_tokens": self.cached_tokens,
            "finish_reason": self.finish_reason(),
            "e2e_latency": end - self.arrival_time,
        }
        if self.spec_accept_lengths is not None:
            info.update(spec_metrics(len(self.stop.output_ids), self.spec_accept_lengths))
        if self.params.return_logprob:
            info["output_token_logprobs"] = list(zip(self.logprobs, self.stop.output_ids, strict=True))
        if self.params.top_logprobs_num:
            info["output_top_logprobs"] = [list(zip(lps, ids, strict=True)) for ids, lps in self.top_logprobs]
        if self.prompt_logprobs is not None:
            lps = [None if np.isnan(v) else float(v) for v in self.prompt_logprobs]
            info["input_token_logprobs"] = list(zip(lps, self.prompt_ids.tolist(), strict=True))
            info["input_top_logprobs"] = [list(zip(t_lps, ids, strict=True))
                                          for ids, t_lps in self.prompt_top_logprobs]
        return info


def spec_metrics(completion_tokens: int, accept_lengths: list[int]) -> dict:
    """`spec_verify_ct` (verify rounds), `spec_accept_lengths` (drafts accepted in each), `spec_accept_length`
    = completion tokens / verify rounds (SGLang's acc_length; the token sampled after prefill counts) and
    `spec_accept_histogram[k]`: rounds that accepted k drafts."""
    rounds = len(accept_lengths)
    return {"spec_verify_ct": rounds, "spec_accept_lengths": list(accept_lengths),
            "spec_accept_length": completion_tokens / rounds if rounds else float(completion_tokens),
            "spec_accept_histogram": [int(c) for c in np.bincount(accept_lengths)] if rounds else []}


def make_request(rid: str, prompt_ids: np.ndarray, params: SamplingParams, *, tree_root, seed: int,
                 eos_token_ids=(), detokenize=None) -> Request:
    """A fresh WAITING request (validated elsewhere: see `Engine.submit`). `tree_root`: the prefix tree's
    root (`kv.tree.root`); `detokenize(ids) -> str` for text and stop strings (None: no text)."""
    stop = StopChecker(params, eos_token_ids, detokenize or (lambda ids: ""))
    req = Request(rid, np.asarray(prompt_ids, np.int32), params, seed, params.max_new_tokens, stop,
                  CachedReq(tree_root))
    if params.prompt_logprobs:
        req.prompt_logprobs = np.full(req.prompt_ids.shape[0], np.nan, np.float32)
        req.prompt_top_logprobs = [([], []) for _ in range(req.prompt_ids.shape[0])]
    return req
