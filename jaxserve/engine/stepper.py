"""The `Stepper` seam: what the `Engine` facade drives, one step at a time, and `PlainStepper`.

A stepper owns the step loop over one scheduler: each `step()` schedules, dispatches a device step and
applies results, returning the requests that finished. `PlainStepper` runs the plain decode step;
`jaxserve.speculative.stepper.EagleStepper` runs EAGLE-3 rounds (or plain steps that keep the draft usable).

Overlap schedule (`PlainStepper`, unless `overlap=False`): step t+1 is built and dispatched while step t
runs; the tokens step t sampled reach step t+1 on device (`StepInput.prev_rows`). The host reads step t's
ids only after dispatching t+1, so the device never waits for the host. Sampled outputs are the same under
both schedules (same steps, same keys). While a request with a grammar runs, its next mask needs its last
token on the host: the overlap schedule then cuts each step in two (`engine.split_step`): step t+1's
forward is dispatched, step t is read and applied while it runs, and the masks are filled from the
grammars' new states. Step t+1's sampler is then held, not dispatched: the next call schedules and builds
step t+2 first and dispatches the sampler right before t+2's forward, so the device runs forward, sampler,
forward back to back instead of idling after the sampler while the host builds the next step. Without the
overlap schedule (or for a step with prompt logprobs) constrained steps are applied as they are
dispatched.
"""

from __future__ import annotations

import time
from typing import NamedTuple, Protocol

import jax
import numpy as np

from jaxserve.engine import host_read, prompt_logprobs
from jaxserve.engine.kv_cache import KVCache
from jaxserve.engine.request import Request, Status
from jaxserve.engine.runner import Bucket, ModelRunner, Programs
from jaxserve.engine.scheduler import Scheduler
from jaxserve.engine.split_step import fill_masks
from jaxserve.engine.step_input import Buckets, ScheduledSeq, build_step_input
from jaxserve.sampling import SampleOutput, SamplingBatch
from jaxserve.sampling.grammar import fill_bitmask


def _clocks() -> tuple[float, float]:
    """(wall seconds, this thread's CPU seconds) now."""
    return time.perf_counter(), time.thread_time()


class HeldSample(NamedTuple):
    """A split step's sampler, not yet dispatched: the forward's logits and the sampling rows with their
    masks filled."""

    logits: jax.Array
    sampling: SamplingBatch


class Stepper(Protocol):
    """One step loop over `scheduler`. `step()` -> finished requests ([] when nothing is to do); `idle`:
    nothing queued, running or in flight; `forget(req)`: drop what the stepper holds for a request that
    was aborted (its KV is the scheduler's business); `num_compiles`: executables per jitted program;
    `warm_plan()`: (programs, bucket, abstract arguments) of the programs its steps can use, in the order
    to compile them (`runner.largest_first`); `stats`: counters, `stats["steps"]` the steps dispatched."""

    scheduler: Scheduler
    stats: dict

    def step(self) -> list[Request]: ...

    @property
    def idle(self) -> bool: ...

    def forget(self, req: Request) -> None: ...

    @property
    def num_compiles(self) -> dict[str, int]: ...

    def warm_plan(self) -> list[tuple[Programs, Bucket, tuple]]: ...


class PlainStepper:
    """Plain decoding: every step is one ragged batch (prefill chunks and decodes) through `runner`.
    `stats`: steps, tokens fed, host seconds (wall, and the main thread's CPU) and seconds spent waiting
    for the device (reading results)."""

    def __init__(self, kv: KVCache, runner: ModelRunner, buckets: Buckets, *, max_tokens: int,
                 max_running: int, overlap: bool = True) -> None:
        self.kv, self.runner, self.buckets, self.overlap = kv, runner, buckets, overlap
        self.scheduler = Scheduler(kv, max_tokens=max_tokens, max_running=max_running,
                                   set_penalty_row=self._set_penalty_row)
        # dispatched, not applied: (batch, samples - or a split step's held sampler -, the prompt logprobs
        # when a request asked for them)
        self.inflight: tuple[list[ScheduledSeq], SampleOutput | HeldSample, tuple | None] | None = None
        self.stats = {"steps": 0, "host_s": 0.0, "host_cpu_s": 0.0, "device_wait_s": 0.0, "tokens_fed": 0}

    @property
    def idle(self) -> bool:
        return self.scheduler.idle and self.inflight is None

    def forget(self, req: Request) -> None:
        """Nothing per request lives here: a step in flight skips an aborted request when applied."""

    @property
    def num_compiles(self) -> dict[str, int]:
        counts = {"step": self.runner.num_compiles}
        if self.runner.num_split_compiles:
            counts["split_step"] = self.runner.num_split_compiles
        return counts

    def warm_plan(self) -> list[tuple[Programs, Bucket, tuple]]:
        """The plain step's bucket shapes (`ModelRunner.warm_plan`)."""
        return self.runner.warm_plan()

    def _dispatch_held(self) -> None:
        """Dispatch the step in flight's held sampler, if it has one. Runs before anything that must come
        after it on the device: the next forward (it reads the sampled tokens), a penalty row written for
        a new request (the row may be one the held sampler still counts a token into: a request that
        finished a step earlier than the host knew), reading the samples."""
        if self.inflight is not None and isinstance(self.inflight[1], HeldSample):
            batch, held, prompt = self.inflight
            self.inflight = (batch, self.runner.run_sample(held.logits, held.sampling), prompt)

    def _take_inflight(self) -> tuple | None:
        """The step in flight, its held sampler dispatched (to be applied by the caller); nothing is in
        flight afterwards."""
        self._dispatch_held()
        inflight, self.inflight = self.inflight, None
        return inflight

    def _set_penalty_row(self, row: int, prompt_ids: np.ndarray, output_ids: list[int]) -> None:
        self._dispatch_held()
        self.runner.set_penalty_row(row, prompt_ids, output_ids)

    def step(self) -> list[Request]:
        """Schedule and dispatch one step, then apply the results of the step before it (overlap) or of
        this one. Returns the requests that finished."""
        t0 = _clocks()
        # a request with a grammar needs its last token on the host for its next mask: while one runs, the
        # overlap schedule splits the step; without it, a step in flight is applied first, on its own, and
        # each step is applied as it is dispatched
        constrained = any(r.grammar is not None for r in self.scheduler.running)
        if constrained and self.overlap:
            return self._split_step(t0)
        batch = [] if constrained and self.inflight is not None else self.scheduler.schedule()
        inflight = self._take_inflight()
        if batch:
            prev_rows = {} if inflight is None else {
                s.req: row for row, s in enumerate(inflight[0]) if s.samples}
            inp = build_step_input(batch, self.kv, self.buckets, prev_rows)
            next_ids = prompt_logprobs.next_token_ids(batch, inp.meta.num_tokens)
            out, prompt = (self.runner.run(inp), None) if next_ids is None else \
                self.runner.run_with_prompt_logprobs(inp, next_ids)
            self.inflight = (batch, out, prompt)
            self.stats["steps"] += 1
            self.stats["tokens_fed"] += sum(s.num_tokens for s in batch)
        if (not self.overlap or constrained) and batch:  # apply this step now (nothing else is in flight)
            inflight, self.inflight = self.inflight, None
        return self._apply(inflight, t0)

    def _split_step(self, t0: float) -> list[Request]:
        """One constrained step under the overlap schedule: build this step, dispatch the held sampler of
        the step in flight and this step's forward, apply the step in flight while the forward runs, then
        fill this step's masks and hold its sampler for the next call."""
        batch = self.scheduler.schedule()
        if not batch:
            return self._apply(self._take_inflight(), t0)
        prev_rows = {} if self.inflight is None else {
            s.req: row for row, s in enumerate(self.inflight[0]) if s.samples}
        inp = build_step_input(batch, self.kv, self.buckets, prev_rows, masks=False)
        next_ids = prompt_logprobs.next_token_ids(batch, inp.meta.num_tokens)
        self.stats["steps"] += 1
        self.stats["tokens_fed"] += sum(s.num_tokens for s in batch)
        inflight = self._take_inflight()  # the step before's sampler, then this forward: it reads its samples
        logits = None
        if next_ids is None:
            logits = self.runner.run_forward(inp)
        finished = self._apply(inflight, t0)
        t0 = _clocks()
        # every token before this step is applied now: the grammars are in the state this step samples from
        # (a request that just finished gets no mask: its row is skipped when applied)
        masks = fill_bitmask([s.req.grammar if s.samples and s.req.status is Status.RUNNING else None
                              for s in batch], inp.sampling.num_rows)
        sampling = fill_masks(inp.sampling, masks)
        if logits is not None:
            # held: the next call builds its step first, then dispatches this sampler and its forward
            self.inflight = (batch, HeldSample(logits, sampling), None)
            self._count_host(t0, _clocks())
            return finished
        # prompt logprobs need the fused all-positions program: dispatched now and applied at once
        inp = type(inp)(inp.input_ids, inp.prev_rows, inp.meta, sampling)
        out, prompt = self.runner.run_with_prompt_logprobs(inp, next_ids)
        return finished + self._apply((batch, out, prompt), t0)

    def _apply(self, inflight: tuple | None, t0: float) -> list[Request]:
        """Read a dispatched step's results and apply them (`t0`: when this step's host work began)."""
        if inflight is None:
            return []
        if isinstance(inflight[1], HeldSample):
            raise RuntimeError("a held sampler is dispatched before its step is applied")
        t1 = _clocks()
        out = inflight[1]
        token_ids, logprobs = host_read.to_host(out.token_ids, out.logprobs)
        wants_top = any(s.req.params.top_logprobs_num for s in inflight[0])
        top = host_read.to_host(out.top_ids, out.top_logprobs) if wants_top else None
        if inflight[2] is not None:
            prompt_logprobs.record(inflight[0], *host_read.to_host(*inflight[2]))
        t2 = _clocks()
        finished = self.scheduler.process(inflight[0], token_ids, logprobs, top)
        self._count_host(t0, t1)
        self._count_host(t2, _clocks())
        self.stats["device_wait_s"] += t2[0] - t1[0]
        return finished

    def _count_host(self, start: tuple[float, float], stop: tuple[float, float]) -> None:
        """Add one stretch of host work (`_clocks` at its ends): its wall seconds to `host_s`, the main
        thread's CPU seconds to `host_cpu_s`. On a CPU backend the device's threads share the cores with
        this one, so the wall stretches with the device's load while the CPU seconds measure the work."""
        self.stats["host_s"] += stop[0] - start[0]
        self.stats["host_cpu_s"] += stop[1] - start[1]
