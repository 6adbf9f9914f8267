"""`--warmup` without a dead port: the step programs are compiled by running small synthetic requests through
the engine on its own thread, between and alongside real requests, while the server already answers.

One warm-up group per sequence bucket `s` of the engine (1, 2, 4, ... up to max_running_requests): `s`
requests of `PROMPT_TOKENS` random tokens and `NEW_TOKENS` new tokens each, submitted together so that they
share their prefill step and their decode steps. A group therefore compiles the prefill and decode programs
of its batch size at the narrowest page-table width (plain or speculative: whatever the engine runs), the
shapes short requests use. Groups run one after another; `/health` reports `{"status": "warming",
"compiled": done, "total": groups}` until the last one finished. Warm-up requests never reach clients or
metrics; their prefixes are flushed from the cache at the end when the engine is idle.

`prime(engine)` runs the first group (one short request) to completion before the server listens, with or
without `--warmup`: a restarted server then loads the programs a first short request needs from the
persistent compilation cache before it says it is ready, instead of while that request waits.
"""

from __future__ import annotations

import logging
import time

import numpy as np

logger = logging.getLogger("jaxserve.server")

PROMPT_TOKENS = 8
NEW_TOKENS = 3


class Warmup:
    """The warm-up plan of one engine and its progress. Driven from the engine thread (`advance`); `done`
    and `total` may be read from any thread."""

    def __init__(self, seq_buckets: tuple[int, ...], vocab_size: int, seed: int = 0) -> None:
        self.groups = sorted(set(seq_buckets))
        self.total = len(self.groups)
        self.done = 0
        self._rng = np.random.default_rng(seed)
        self._vocab_size = vocab_size
        self._current: list[str] = []
        self._started = time.monotonic()

    @property
    def finished(self) -> bool:
        return self.done == self.total

    def status(self) -> dict[str, object]:
        return {"status": "warming", "compiled": self.done, "total": self.total}

    def advance(self, engine) -> None:
        """Retire the current group once all its requests finished, and submit the next one. Call between
        engine steps on the engine thread."""
        if self._current:
            if not all(engine.request(rid).finished for rid in self._current):
                return
            for rid in self._current:
                engine.forget(rid)
            self._current = []
            self.done += 1
            logger.info(f"warmup: {self.done}/{self.total} groups ({time.monotonic() - self._started:.1f} s)")
            if self.finished:
                if engine.idle:
                    engine.flush_cache()
                logger.info(f"warmup finished in {time.monotonic() - self._started:.1f} s")
                return
        if self.done < self.total:
            params = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
            upper = max(3, self._vocab_size)
            self._current = [
                engine.submit(input_ids=self._rng.integers(2, upper, size=PROMPT_TOKENS).tolist(),
                              sampling_params=params)
                for _ in range(self.groups[self.done])]


def prime(engine, vocab_size: int) -> float:
    """Run one short synthetic request through `engine` (idle, not yet serving) and flush the cache again;
    returns the seconds it took."""
    start = time.monotonic()
    prompt = np.random.default_rng(0).integers(2, max(3, vocab_size), size=PROMPT_TOKENS).tolist()
    engine.generate(input_ids=prompt, sampling_params={"temperature": 0, "max_new_tokens": NEW_TOKENS,
                                                       "ignore_eos": True})
    engine.flush_cache()
    return time.monotonic() - start
