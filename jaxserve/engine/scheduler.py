"""`Scheduler`: continuous batching on the host - admission, chunked prefill, eviction, retraction, finish.

Each `schedule()` builds one ragged step of at most `max_tokens` tokens:
1. running requests, decodes (one token) before prefill continuations, each in admission order; a request's
   slots are allocated here (`KVCache.extend`, which evicts unlocked tree nodes first when short). If the pool
   is still short, the newest running request is *retracted*: `release_req` frees its private KV while the
   tree keeps (unlocked) what it had cached, and the request goes back to the front of the queue with its
   output so far, to be recomputed from whatever prefix the tree still holds. The oldest request therefore
   always progresses: a request that fits the pool alone (checked on submit) always finishes.
2. waiting requests, first come first served, while tokens, sequence rows and memory last (not in a step that
   retracted): `admit` matches and locks the longest cached prefix, the rest is prefilled in chunks.
After the step, `process` appends sampled tokens, caches every prefill chunk (`cache_unfinished_req`, also
the last one, so that later arrivals match a running request's prompt) and finished requests
(`cache_finished_req`). The cache call sites are SGLang's (`cache/README.md`, "Scheduler call sites").
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import numpy as np

from jaxserve.engine.errors import SchedulerStuckError
from jaxserve.engine.kv_cache import KVCache
from jaxserve.engine.request import Request, Status
from jaxserve.engine.row_pool import RowPool
from jaxserve.engine.step_input import ScheduledSeq

PenaltyRowSetter = Callable[[int, np.ndarray, list], None]


class Scheduler:
    """Queue + running set over one `KVCache`. `max_tokens`: step token budget (chunked_prefill_size);
    `max_running`: most requests running at once. `set_penalty_row(row, prompt_ids, output_ids)` is called
    when a request using penalties is (re)admitted."""

    def __init__(self, kv: KVCache, *, max_tokens: int, max_running: int,
                 set_penalty_row: PenaltyRowSetter | None = None) -> None:
        self.kv = kv
        self.max_tokens = max_tokens
        self.max_running = max_running
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._penalty_rows = RowPool(max_running)
        self._set_penalty_row = set_penalty_row
        self.num_retractions = 0
        self.num_prompt_tokens_computed = 0  # prompt positions whose KV was computed (recomputes included)

    # ------------------------------------------------------------------ queue
    def add(self, req: Request) -> None:
        self.waiting.append(req)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def live_requests(self) -> list[Request]:
        return [*self.running, *self.waiting]

    # ------------------------------------------------------------------ schedule
    def schedule(self) -> list[ScheduledSeq]:
        """The next step's sequences, their slots allocated. Empty only when idle."""
        for _ in range(2):
            batch = self._schedule_once()
            if batch or self.idle or any(r.num_pending for r in self.running):
                return batch  # empty with tokens in flight: their results may finish or free requests
        raise SchedulerStuckError(f"no progress with {len(self.running)} running and {len(self.waiting)} "
                                  f"waiting requests ({self.kv.available_slots()} slots free)")

    def _schedule_once(self) -> list[ScheduledSeq]:
        batch, budget = self._schedule_running_fast()
        retracted = False
        if batch is None:
            batch, budget, retracted = self._schedule_running_slow()
        if not retracted:
            self._admit_waiting(batch, budget)
        return batch

    def _admit_waiting(self, batch: list[ScheduledSeq], budget: int) -> None:
        """Admit queued requests in order (FCFS) into `batch` while the token budget, the running limit and
        the pool allow."""
        while self.waiting and budget > 0 and len(self.running) < self.max_running:
            seq = self._admit(self.waiting[0], budget)
            if seq is None:
                break
            batch.append(seq)
            budget -= seq.num_tokens

    def _schedule_running_slow(self) -> tuple[list[ScheduledSeq], int, bool]:
        """Running requests one by one, retracting the newest while the pool is short. Returns the batch,
        the token budget left and whether anything was retracted."""
        batch: list[ScheduledSeq] = []
        budget, retracted = self.max_tokens, False
        for req in sorted(self.running, key=lambda r: r.num_remaining > 1):
            if budget == 0:
                break
            if req.status is not Status.RUNNING or req.last_token_in_flight:
                continue  # retracted earlier in this loop, or its last token is already in flight
            num_tokens = min(req.num_remaining, budget)
            while not self.kv.extend(req.cached, req.num_computed, req.num_computed + num_tokens):
                victim = self.running[-1]
                budget += self._retract(victim, batch)
                retracted = True
                if victim is req:
                    break
            else:
                batch.append(self._commit(req, num_tokens))
                budget -= num_tokens
        return batch, budget, retracted

    def _schedule_running_fast(self) -> tuple[list[ScheduledSeq] | None, int]:
        """Every running request's share of the step with one allocation; (None, full budget) when the pool
        is short, and the per-request path (with retraction) decides."""
        spans, budget = [], self.max_tokens
        for req in sorted(self.running, key=lambda r: r.num_remaining > 1):
            if budget == 0:
                break
            if not req.last_token_in_flight:
                num_tokens = min(req.num_remaining, budget)
                spans.append((req, num_tokens))
                budget -= num_tokens
        if not self.kv.extend_many([(r.cached, r.num_computed, r.num_computed + n) for r, n in spans]):
            return None, self.max_tokens
        return [self._commit(req, n) for req, n in spans], budget

    @staticmethod
    def _commit(req: Request, num_tokens: int) -> ScheduledSeq:
        """Record that a dispatched step computes `num_tokens` more tokens of `req` (and samples one more
        token when they end its fill: pending until the step's result is read)."""
        seq = ScheduledSeq(req, req.num_computed, num_tokens, req.num_computed + num_tokens == req.fill_len)
        req.num_computed += num_tokens
        req.num_pending += seq.samples
        return seq

    def _admit(self, req: Request, budget: int) -> ScheduledSeq | None:
        """Match + lock the cached prefix and allocate the first chunk; None (nothing held) if short."""
        fill = req.fill_ids()
        # prompt logprobs need every prompt position computed: no prefix reuse the first time
        fresh = req.params.prompt_logprobs and req.num_retractions == 0
        prefix = self.kv.tree.admit(req.cached, fill[:1] if fresh else fill)
        num_tokens = min(fill.shape[0] - prefix, budget)
        if not self.kv.extend(req.cached, prefix, prefix + num_tokens):
            self.kv.tree.release_req(req.cached)
            return None
        self.waiting.popleft()
        self.running.append(req)
        req.status, req.num_computed = Status.RUNNING, prefix
        if req.num_retractions == 0:
            req.cached_tokens = prefix
        if req.params.uses_penalties and self._set_penalty_row is not None:
            req.penalty_row = self._penalty_rows.acquire(req)
            self._set_penalty_row(req.penalty_row, req.prompt_ids, list(req.output_ids))
        return self._commit(req, num_tokens)

    def _retract(self, req: Request, batch: list[ScheduledSeq]) -> int:
        """Preempt a running request: free its private KV (the tree keeps its cached part), requeue it at the
        front. Returns the step tokens it gave back."""
        given_back = sum(s.num_tokens for s in batch if s.req is req)
        batch[:] = [s for s in batch if s.req is not req]
        self._drop_running(req)
        self.kv.tree.release_req(req.cached)
        req.status, req.num_computed, req.num_pending = Status.WAITING, 0, 0  # a pending token is recomputed
        req.num_retractions += 1
        self.num_retractions += 1
        self.waiting.appendleft(req)
        return given_back

    def _drop_running(self, req: Request) -> None:
        self.running.remove(req)
        self._penalty_rows.release(req)
        req.penalty_row = None

    # ------------------------------------------------------------------ results
    def process(self, batch: list[ScheduledSeq], token_ids: np.ndarray, logprobs: np.ndarray,
                top: tuple[np.ndarray, np.ndarray] | None = None) -> list[Request]:
        """Apply a step's results (steps are processed in dispatch order): append sampled tokens, cache
        prefill chunks, finish requests (their KV goes to the tree or back to the allocator). Requests
        aborted, retracted or finished since the step was scheduled are skipped. Returns the finished ones.
        `top`: the step's (top_ids, top_logprobs) per row, read when a request of the batch asks for them."""
        finished = []
        for row, seq in enumerate(batch):
            req = seq.req
            if req.status is not Status.RUNNING or seq.start + seq.num_tokens > req.num_computed:
                continue  # aborted / finished / retracted (and maybe re-admitted) since it was scheduled
            stop = seq.start + seq.num_tokens
            prompt_len = int(req.prompt_ids.shape[0])
            self.num_prompt_tokens_computed += max(0, min(stop, prompt_len) - seq.start)
            if seq.num_tokens > 1 or not seq.samples:
                # after every prefill chunk, final ones included: later arrivals can match it right away
                self.kv.tree.cache_unfinished_req(req.cached, req.fill_ids()[:stop])
            if not seq.samples:
                continue
            req.num_pending -= 1
            tops = (top[0][row], top[1][row]) if top else ((), ())
            if req.append_output(int(token_ids[row]), float(logprobs[row]), *tops) is not None:
                self._finish(req)
                finished.append(req)
        return finished

    def _finish(self, req: Request) -> None:
        self._drop_running(req)
        self.kv.tree.cache_finished_req(req.cached, self._finished_ids(req))
        req.status, req.finish_time = Status.FINISHED, time.perf_counter()

    def _finished_ids(self, req: Request) -> np.ndarray:
        """The tokens the prefix tree caches a finished request by (all of them here)."""
        return req.fill_ids()

    def abort(self, req: Request) -> None:
        """Stop a request wherever it is; its private KV returns to the allocator now."""
        if req.status is Status.WAITING:
            self.waiting.remove(req)
        elif req.status is Status.RUNNING:
            self._drop_running(req)
            self.kv.tree.release_req(req.cached)
        else:
            return
        req.status, req.finish_time = Status.ABORTED, time.perf_counter()
