"""`--warmup` without a dead port: the step programs the served configuration uses are queued for the
background compile thread (`engine.runner.Programs`) while the server already answers.

The plan (`plan_shapes`) is the stepper's `warm_plan()` cut to what short and batched traffic uses: first
the largest bucket of each program (once it is compiled, any step that has no exact program yet runs
padded to it instead of waiting for a compile), then every sequence bucket at the narrowest page-table
width (decode steps: the chain round under EAGLE-3, the plain step otherwise) and single-sequence
prefills of up to `PREFILL_TOKENS` tokens at that width. Other shapes compile on first use, in the
background while their steps run padded. `/health` reports `{"status": "warming", "compiled": k,
"total": n}` (programs) until the last one is compiled.

`prime(engine)` runs one short request to completion and compiles the largest bucket of each program before
the server listens, with or without `--warmup`: no step waits for a compile after that (it runs padded
while its own program compiles in the background), and a restarted server loads these programs from the
persistent compilation cache before it says it is ready, instead of while a request waits.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from jaxserve.api import Engine
    from jaxserve.engine.runner import Bucket, Programs

logger = logging.getLogger("jaxserve.server")

PROMPT_TOKENS = 8
NEW_TOKENS = 3
PREFILL_TOKENS = 64  # single-sequence prefill buckets warmed at the narrowest width, up to this many tokens


def plan_shapes(engine: Engine) -> list[tuple[Programs, Bucket, tuple]]:
    """The warm-up cut of `engine.stepper.warm_plan()` (see the module docstring), in its order."""
    plan = engine.stepper.warm_plan()
    narrowest = min(engine.buckets.pages)
    rounds = any(len(bucket) == 2 for _, bucket, _ in plan)  # EAGLE-3 decodes in chain rounds
    heads: set = set()
    keep = []
    for programs, bucket, args in plan:
        first = programs not in heads
        heads.add(programs)
        tokens_seqs, pages = bucket[:-1], bucket[-1]
        decode = len(bucket) == 2 or (not rounds and tokens_seqs[0] == min(engine.buckets.tokens))
        prefill = len(bucket) == 3 and tokens_seqs[1] == 1 and tokens_seqs[0] <= PREFILL_TOKENS
        if first or (pages == narrowest and (decode or prefill)):
            keep.append((programs, bucket, args))
    return keep


class Warmup:
    """The warm-up plan of one engine and its progress: `advance` (on the engine thread) queues the plan's
    programs on the background compile thread; `done` and `total` may be read from any thread."""

    def __init__(self, plan: list[tuple[Programs, Bucket, tuple]]) -> None:
        self.plan = plan
        self.total = len(plan)
        self._events: list = []
        self._started = time.monotonic()
        self._logged = False

    @property
    def done(self) -> int:
        return sum(event.is_set() for event in self._events)

    @property
    def finished(self) -> bool:
        """Every program of the plan is compiled and the engine thread has noticed (`advance`)."""
        return self._logged

    def status(self) -> dict[str, object]:
        return {"status": "warming", "compiled": self.done, "total": self.total}

    def advance(self, engine: Engine) -> None:
        """Queue the plan (first call), then log once it is all compiled. Call between engine steps on the
        engine thread."""
        if not self._events:
            self._events = [programs.prepare(bucket, args) for programs, bucket, args in self.plan]
            logger.info(f"warmup: {self.total} step programs queued for the background compile thread")
        if not self._logged and self.done == self.total:
            self._logged = True
            seconds = time.monotonic() - self._started
            logger.info(f"warmup finished in {seconds:.1f} s ({self.total} programs)")


def prime(engine: Engine, vocab_size: int) -> float:
    """Run one short synthetic request through `engine` (idle, not yet serving), flush the cache again and
    compile the largest bucket of each of the stepper's programs (from then on a step whose own program is
    not compiled yet runs padded instead of waiting); returns the seconds it took."""
    start = time.monotonic()
    prompt = np.random.default_rng(0).integers(2, max(3, vocab_size), size=PROMPT_TOKENS).tolist()
    engine.generate(input_ids=prompt, sampling_params={"temperature": 0, "max_new_tokens": NEW_TOKENS,
                                                       "ignore_eos": True})
    engine.flush_cache()
    largest: dict = {}
    for programs, bucket, args in engine.stepper.warm_plan():
        largest.setdefault(programs, (bucket, args))
    for event in [programs.prepare(bucket, args) for programs, (bucket, args) in largest.items()]:
        event.wait()
    return time.monotonic() - start
