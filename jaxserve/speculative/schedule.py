"""`SpecScheduler`: the engine's scheduler with prefill and speculative decode rounds kept apart.

A speculative step is either a prefill step (prompt chunks of admitted or re-admitted requests, each followed
by the draft's extend over the same positions) or a decode round over every decoding request (draft chain,
verify, accept, draft extend: `jaxserve.speculative.stepper`). `schedule_prefill` builds the former with the
base scheduler's admission rules; decode rounds allocate their own slots, and a plain decode step under
speculation takes one slot per request through `commit_decodes`. Retraction works as in the base
scheduler: the newest running request gives its private KV back and is prefilled again later.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from jaxserve.engine.kv_cache import KVCache
from jaxserve.engine.request import Request, Status
from jaxserve.engine.scheduler import Scheduler
from jaxserve.engine.step_input import ScheduledSeq


class SpecScheduler(Scheduler):
    """`Scheduler` whose steps contain prefill chunks only; decoding requests are left to the stepper.

    A running request decodes once its prefill has sampled (the stepper then holds its draft state:
    `has_state(req)`), whatever is left to feed; `on_retract(req)` lets the stepper drop that state;
    `before_finish(req)` (optional) runs as a request finishes, while it still holds its slots (before they
    go to the prefix tree); `cache_limit(req)` (optional) is None, or the first position whose KV the prefix
    tree must not cache as the request finishes (its draft KV is missing from there). The hooks are the
    stepper's, given here at construction."""

    def __init__(self, kv: KVCache, *, has_state: Callable[[Request], bool],
                 on_retract: Callable[[Request], object],
                 before_finish: Callable[[Request], object] | None = None,
                 cache_limit: Callable[[Request], int | None] | None = None, **kwargs) -> None:
        super().__init__(kv, **kwargs)
        self.has_state = has_state
        self.on_retract = on_retract
        self.before_finish = before_finish
        self.cache_limit = cache_limit

    def schedule_prefill(self) -> list[ScheduledSeq]:
        """Continuations of running prefills (oldest first), then admissions, within the token budget and the
        pool; [] when nothing is to prefill (or nothing fits now)."""
        batch: list[ScheduledSeq] = []
        budget = self.max_tokens
        for req in list(self.running):
            if budget == 0 or req.status is not Status.RUNNING or self.has_state(req):
                continue
            num_tokens = min(req.num_remaining, budget)
            while not self.kv.extend(req.cached, req.num_computed, req.num_computed + num_tokens):
                victim = self.running[-1]
                budget += self._retract(victim, batch)
                if victim is req:
                    break
            else:
                batch.append(self._commit(req, num_tokens))
                budget -= num_tokens
        self._admit_waiting(batch, budget)
        return batch

    def decoding(self) -> list[Request]:
        """Running requests whose next step is a decode round (every token but the last one has KV)."""
        return [r for r in self.running if r.status is Status.RUNNING and self.has_state(r)]

    def commit_decodes(self, reqs: list[Request]) -> list[ScheduledSeq]:
        """A plain decode step for decoding requests: one slot each (one allocator call; the caller made
        room first, so it cannot fail), their last token fed, their next one sampled."""
        if not self.kv.extend_many([(r.cached, r.num_computed, r.num_computed + 1) for r in reqs]):
            raise RuntimeError("decode allocation failed after room was made (a bug)")
        return [self._commit(r, 1) for r in reqs]

    def retract_newest(self) -> Request:
        victim = self.running[-1]
        self._retract(victim, [])
        return victim

    def _retract(self, req: Request, batch: list[ScheduledSeq]) -> int:
        self.on_retract(req)
        return super()._retract(req, batch)

    def finish(self, req: Request) -> None:
        self._finish(req)

    def _finish(self, req: Request) -> None:
        if self.before_finish is not None:
            self.before_finish(req)
        super()._finish(req)

    def _finished_ids(self, req: Request) -> np.ndarray:
        """The tokens the prefix tree caches a finished request by: up to `cache_limit(req)` when set (the
        tree keeps the positions whose next token is in the list)."""
        limit = None if self.cache_limit is None else self.cache_limit(req)
        ids = req.fill_ids()
        return ids if limit is None else ids[: limit + 1]
