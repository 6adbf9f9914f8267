"""`python -m jaxserve.bench.fuzz --ops N --seed S`: a long-run fuzzer of the engine's host side.

It drives the real `Scheduler` / `SpecScheduler`, `KVCache` (allocator facades and radix / SWA radix tree)
through random arrivals (shared prefixes or not), chunked prefill, decode steps with the overlap schedule's
one step in flight, speculative rounds with random accept lengths, evictions, retractions, aborts and cache
flushes. Speculative rounds follow the worker's synchronous path (room for the verify span, accept, free the
tail pages: what tree drafting and `--disable-overlap-schedule` run); the overlapped chain schedule, which
keeps a second span for the round in flight, is not modelled. The model is a deterministic stand-in: the
t-th output token of a request is a hash of (its prompt, t), so a request's output does not depend on how it
was scheduled, and `pool_tokens[slot]` stands for the KV written at a slot (the token id of the position
computed there).

After every operation it checks, independently of the cache's own bookkeeping where it can:
- the tree's ownership proof (`KVCache.check`: free / tree / live-private partition every page, full and
  SWA sides, lock and size accounting);
- no slot is private to two running requests, and a running request holds KV for what it computed;
- every context a step reads holds that request's tokens (`pool_tokens` of its full slots, and of its SWA
  slots inside the window): no request ever reads KV another request or a freed slot left behind;
- every finished request's output equals its solo output (the stand-in run alone), and a flush with
  nothing live returns every slot to the allocator.

Configurations (`CONFIGS`): full and hybrid-SWA pools, page sizes 1/4/16, EAGLE (bigram keys, speculative
rounds) on and off, radix cache on and off. Each op draws one configuration's next move; the pools are
small so that eviction and retraction happen often. The JAX pools are allocated (tiny) but never stepped.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
import zlib
from collections.abc import Sequence

import numpy as np

from jaxserve.engine.kv_cache import KVCache
from jaxserve.engine.request import Request, Status, make_request
from jaxserve.engine.scheduler import Scheduler
from jaxserve.engine.step_input import ScheduledSeq
from jaxserve.models.config import ModelConfig
from jaxserve.sampling import SamplingParams
from jaxserve.speculative.schedule import SpecScheduler

VOCAB = 61
EOS = 1
_UNWRITTEN = -1


class InvariantViolation(AssertionError):
    """An ownership or correctness rule broke; the message names the configuration, the op and the rule."""


@dataclasses.dataclass(frozen=True)
class FuzzConfig:
    """One engine shape under test. Units: `num_pages` full pages of `page_size` slots; `max_tokens` step
    budget in tokens; `window` the SWA window in tokens (hybrid only); `num_verify` tokens per speculative
    round (eagle only)."""

    page_size: int
    num_pages: int
    hybrid: bool = False
    eagle: bool = False
    radix: bool = True
    max_tokens: int = 24
    max_running: int = 6
    window: int = 8
    num_verify: int = 4

    @property
    def name(self) -> str:
        kind = "swa" if self.hybrid else "full"
        return (f"{kind}-p{self.page_size}{'-eagle' if self.eagle else ''}"
                f"{'' if self.radix else '-noradix'}")


CONFIGS: tuple[FuzzConfig, ...] = tuple(
    FuzzConfig(page_size=p, num_pages=max(6, 96 // p), hybrid=h, eagle=e, radix=r)
    for p in (1, 4, 16) for h in (False, True) for e in (False, True) for r in (True, False)
    if r or (p == 4 and not e))


def _model_config(cfg: FuzzConfig) -> ModelConfig:
    raw = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": VOCAB,
           "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 2, "num_attention_heads": 1,
           "num_key_value_heads": 1, "head_dim": 8, "max_position_embeddings": 4096}
    if cfg.hybrid:
        raw.update(layer_types=["sliding_attention", "full_attention"], sliding_window=cfg.window)
    return ModelConfig.from_dict(raw)


def stand_in_tokens(prompt_key: int, indices: np.ndarray) -> np.ndarray:
    """The stand-in model's output tokens at `indices` (0 = first output) for a prompt, as int64 (EOS about
    one time in twelve). A 32-bit integer hash of (prompt key, index), so it is the same in every process."""
    h = ((prompt_key * 0x9E3779B1) & 0xFFFFFFFF) + (np.asarray(indices, np.uint64) + 1) * 0x85EBCA77
    h &= 0xFFFFFFFF
    h ^= h >> 15
    h = (h * 0x2C1B3C6D) & 0xFFFFFFFF
    h ^= h >> 12
    return np.where(h % 12 == 0, EOS, 2 + h % (VOCAB - 2)).astype(np.int64)


def stand_in_token(prompt_key: int, index: int) -> int:
    """`stand_in_tokens` for one index, in plain Python (the same hash, for the per-row sampling)."""
    h = (((prompt_key * 0x9E3779B1) & 0xFFFFFFFF) + (index + 1) * 0x85EBCA77) & 0xFFFFFFFF
    h ^= h >> 15
    h = (h * 0x2C1B3C6D) & 0xFFFFFFFF
    h ^= h >> 12
    return EOS if h % 12 == 0 else 2 + h % (VOCAB - 2)


def prompt_key(prompt: np.ndarray) -> int:
    """The stand-in's key for a prompt: a CRC of its token bytes (not `hash`, which differs per process)."""
    return zlib.crc32(np.ascontiguousarray(prompt, np.int32).tobytes())


def solo_output(prompt_key: int, max_new_tokens: int) -> list[int]:
    """What the stand-in produces for a request run alone: tokens until EOS (included) or the budget."""
    out = []
    while len(out) < max_new_tokens:
        out.append(stand_in_token(prompt_key, len(out)))
        if out[-1] == EOS:
            break
    return out


class EngineUnderTest:
    """One configuration's scheduler, KV cache and stand-in pool contents, stepped by `Fuzzer`."""

    def __init__(self, cfg: FuzzConfig, rng: np.random.Generator) -> None:
        self.cfg, self.rng = cfg, rng
        self.kv = KVCache(_model_config(cfg), num_pages=cfg.num_pages, page_size=cfg.page_size,
                          kv_dtype=np.float32, disable_radix_cache=not cfg.radix,
                          swa_num_pages=cfg.num_pages, eagle=cfg.eagle)
        self.decoding: set[Request] = set()  # eagle: requests past their prefill (the stepper's draft state)
        sizes = dict(max_tokens=cfg.max_tokens, max_running=cfg.max_running)
        self.scheduler = SpecScheduler(self.kv, has_state=self.decoding.__contains__,
                                       on_retract=self.decoding.discard, **sizes) if cfg.eagle \
            else Scheduler(self.kv, **sizes)
        total = (cfg.num_pages + 1) * cfg.page_size
        self.pool_tokens = np.full(total, _UNWRITTEN, np.int64)
        self.swa_tokens = np.full(total, _UNWRITTEN, np.int64)
        self.keys: dict[Request, int] = {}
        self.sequences: dict[Request, np.ndarray] = {}  # each live request's tokens, prompt and outputs
        self.inflight: list[ScheduledSeq] | None = None  # the overlap schedule's dispatched step
        self.num_ids = 0
        self.prefixes = [rng.integers(2, VOCAB, size=int(rng.integers(4, 40))) for _ in range(4)]
        self.stats = {"arrivals": 0, "finished": 0, "aborted": 0, "flushes": 0, "steps": 0, "rounds": 0}

    # ------------------------------------------------------------------ requests
    def arrive(self) -> None:
        rng, cfg = self.rng, self.cfg
        shared = self.prefixes[int(rng.integers(len(self.prefixes)))] if rng.random() < 0.6 else []
        suffix = rng.integers(2, VOCAB, size=int(rng.integers(1, 30)))
        prompt = np.concatenate([shared, suffix]).astype(np.int32)
        reserve = cfg.num_verify + 2 if cfg.eagle else 0
        most = self.kv.max_request_tokens - reserve - cfg.page_size
        if prompt.shape[0] > most - 2:
            prompt = prompt[: most - 2]
        max_new = int(rng.integers(1, min(24, most - prompt.shape[0]) + 1))
        params = SamplingParams(temperature=0.0, max_new_tokens=max_new)
        req = make_request(f"f{self.num_ids}", prompt, params, tree_root=self.kv.tree.root, seed=0,
                           eos_token_ids=(EOS,))
        self.num_ids += 1
        self.keys[req] = key = prompt_key(prompt)
        # every position a step can reach: the prompt, then the stand-in's outputs past the budget (drafts)
        outputs = stand_in_tokens(key, np.arange(max_new + cfg.num_verify + 1))
        self.sequences[req] = np.concatenate([prompt.astype(np.int64), outputs])
        self.scheduler.add(req)
        self.stats["arrivals"] += 1

    def abort_one(self) -> None:
        live = self.scheduler.live_requests()
        if not live:
            return
        req = live[int(self.rng.integers(len(live)))]
        self.scheduler.abort(req)
        self.decoding.discard(req)
        self._done(req)

    def flush(self) -> None:
        """Flush when nothing is live (as `Engine.flush_cache` requires); `KVCache.flush` itself raises
        if any slot is still owned after the tree's are freed (a leak)."""
        if self.scheduler.idle and self.inflight is None:
            self.kv.flush()
            self.stats["flushes"] += 1

    def _done(self, req: Request) -> None:
        if req.status is Status.FINISHED:
            expected = solo_output(self.keys[req], req.params.max_new_tokens)
            if list(req.output_ids) != expected:
                raise InvariantViolation(f"{req.rid}: output {list(req.output_ids)} != solo {expected}")
            self.stats["finished"] += 1
        else:
            self.stats["aborted"] += 1
        del self.keys[req], self.sequences[req]

    # ------------------------------------------------------------------ the stand-in model
    def _tokens(self, req: Request, start: int, stop: int) -> np.ndarray:
        """The tokens of `req` at positions [start, stop) (prompt or output, pending tokens included)."""
        return self.sequences[req][start:stop]

    def _read_and_write(self, req: Request, start: int, stop: int, tokens: np.ndarray) -> None:
        """A step computes positions [start, stop) of `req` with these tokens: it first reads the context
        (every earlier position's KV must hold that request's token), then writes its own."""
        slots = req.cached.kv_slots
        if slots.shape[0] < stop:
            raise InvariantViolation(f"{req.rid}: {slots.shape[0]} slots for a step up to position {stop}")
        expected = self._tokens(req, 0, start)
        held = self.pool_tokens[slots[:start]]
        if not np.array_equal(held, expected):
            bad = int(np.flatnonzero(held != expected)[0])
            raise InvariantViolation(f"{req.rid}: position {bad} reads KV of token {held[bad]}, expected "
                                     f"{expected[bad]} (slot {slots[bad]})")
        self.pool_tokens[slots[start:stop]] = tokens
        if self.kv.hybrid:
            lo = max(0, start - self.cfg.window + 1)
            swa = self.kv.allocator.swa_slots_of(slots[lo:stop])
            window_held = self.swa_tokens[swa[: start - lo]]
            if not np.array_equal(window_held, expected[lo:start]):
                raise InvariantViolation(f"{req.rid}: SWA window [{lo}, {start}) reads {window_held}, "
                                         f"expected {expected[lo:start]}")
            self.swa_tokens[swa[start - lo:]] = tokens

    def _dispatch(self, batch: list[ScheduledSeq]) -> None:
        for seq in batch:
            stop = seq.start + seq.num_tokens
            self._read_and_write(seq.req, seq.start, stop, self._tokens(seq.req, seq.start, stop))

    def _sampled(self, batch: list[ScheduledSeq]) -> tuple[np.ndarray, np.ndarray]:
        ids = np.zeros(max(1, len(batch)), np.int32)
        for row, seq in enumerate(batch):
            if seq.samples:
                stop = seq.start + seq.num_tokens
                # a request aborted or finished since dispatch: its row is skipped by `process`
                ids[row] = stand_in_token(self.keys.get(seq.req, 0), stop - seq.req.prompt_ids.shape[0])
        return ids, np.zeros(ids.shape[0], np.float32)

    # ------------------------------------------------------------------ steps
    def step(self) -> None:
        self.stats["steps"] += 1
        if self.cfg.eagle:
            return self._spec_step()
        batch = self.scheduler.schedule()
        self._dispatch(batch)
        prev, self.inflight = self.inflight, (batch or None)
        if prev is not None:
            for req in self.scheduler.process(prev, *self._sampled(prev)):
                self._done(req)

    def drain(self) -> None:
        """Apply the step in flight (the engine does this before it is idle)."""
        prev, self.inflight = self.inflight, None
        if prev is not None:
            for req in self.scheduler.process(prev, *self._sampled(prev)):
                self._done(req)

    def _spec_step(self) -> None:
        sched = self.scheduler
        batch = sched.schedule_prefill()
        if batch:
            self._dispatch(batch)
            finished = sched.process(batch, *self._sampled(batch))
            for seq in batch:
                if seq.samples and seq.req.status is Status.RUNNING:
                    self.decoding.add(seq.req)
            for req in finished:
                self._done(req)
            return
        reqs = sched.decoding()
        if reqs:
            self._spec_round(reqs)

    def _spec_round(self, reqs: list[Request]) -> None:
        """One synchronous verify round, as the worker does it on the host: room for every request's verify
        span (evicting, then retracting the newest), the span computed, a random number of drafts accepted,
        the tail past the new end freed page by page."""
        kv, nv, sched = self.kv, self.cfg.num_verify, self.scheduler
        for req in list(reqs):
            need = req.num_computed + nv
            while req.status is Status.RUNNING and req.cached.kv_slots.shape[0] < need and not kv.extend(
                    req.cached, req.cached.kv_slots.shape[0], need):
                sched.retract_newest()
        reqs = [r for r in reqs if r.status is Status.RUNNING and r in self.decoding]
        self.stats["rounds"] += 1
        for req in reqs:
            n = req.num_computed
            accepted = int(self.rng.integers(0, nv))
            drafts = np.concatenate([self._tokens(req, n, n + accepted + 1),
                                     self.rng.integers(2, VOCAB, size=nv - accepted - 1)])
            self._read_and_write(req, n, n + nv, drafts)
            done = req.prompt_ids.shape[0] + len(req.output_ids)  # the position of the next output token
            new = self.sequences[req][done:done + accepted + 1].tolist()
            finished = False
            for token in new:
                if req.stop.append(token) is not None:
                    finished = True
                    break
            end = n + accepted + 1
            kv.shrink(req.cached, end)
            req.num_computed = end
            if finished:
                sched.finish(req)
                self.decoding.discard(req)
                self._done(req)

    # ------------------------------------------------------------------ checks
    def check(self) -> None:
        running = self.scheduler.running
        try:
            self.kv.check([r.cached for r in running])
        except AssertionError as exc:
            raise InvariantViolation(f"ownership proof: {exc}") from exc
        private = [r.cached.kv_slots[r.cached.last_matched_prefix_len:] for r in running]
        if private:
            flat = np.concatenate(private)
            if np.unique(flat).shape[0] != flat.shape[0]:
                raise InvariantViolation("a slot is private to two running requests")
        for req in running:
            if req.cached.kv_slots.shape[0] < req.num_computed:
                raise InvariantViolation(f"{req.rid}: computed {req.num_computed} positions but holds "
                                         f"{req.cached.kv_slots.shape[0]} slots")

    def check_idle(self) -> None:
        """Nothing live: every slot is free or in the tree (no leak)."""
        if not (self.scheduler.idle and self.inflight is None):
            return
        kv = self.kv
        free = kv.allocator.full_available_size() if kv.hybrid else kv.allocator.available_size()
        if free + kv.tree_slots() != kv.num_slots:
            raise InvariantViolation(f"idle: {free} free + {kv.tree_slots()} in the tree != {kv.num_slots}")


@dataclasses.dataclass
class FuzzReport:
    num_ops: int
    seconds: float
    per_config: dict[str, dict[str, int]]

    def summary(self) -> str:
        totals: dict[str, int] = {}
        for stats in self.per_config.values():
            for key, value in stats.items():
                totals[key] = totals.get(key, 0) + value
        parts = ", ".join(f"{k} {v}" for k, v in totals.items())
        return (f"{self.num_ops} ops over {len(self.per_config)} configurations in {self.seconds:.1f} s, "
                f"0 violations ({parts})")


def fuzz(num_ops: int, seed: int, configs: Sequence[FuzzConfig] = CONFIGS) -> FuzzReport:
    """Run `num_ops` random operations spread over `configs`; raises InvariantViolation (naming the
    configuration and the op number) on the first broken rule, else returns the report."""
    rng = np.random.default_rng(seed)
    engines = [EngineUnderTest(cfg, np.random.default_rng(rng.integers(1 << 63))) for cfg in configs]
    ops = ("arrive", "step", "step", "step", "step", "abort", "flush")
    weights = np.array([0.22, 0.18, 0.18, 0.18, 0.18, 0.04, 0.02])
    start = time.perf_counter()
    choices = rng.choice(len(ops), size=num_ops, p=weights / weights.sum())
    which = rng.integers(len(engines), size=num_ops)
    for i in range(num_ops):
        eng = engines[int(which[i])]
        op = ops[int(choices[i])]
        try:
            if op == "arrive":
                if len(eng.scheduler.waiting) < 3 * eng.cfg.max_running:
                    eng.arrive()
            elif op == "step":
                if eng.scheduler.idle:
                    eng.drain()
                else:
                    eng.step()
            elif op == "abort":
                eng.abort_one()
            else:
                eng.drain()
                eng.flush()
            eng.check()
            eng.check_idle()
        except InvariantViolation as exc:
            raise InvariantViolation(f"[{eng.cfg.name}] op {i} ({op}): {exc}") from exc
    return FuzzReport(num_ops, time.perf_counter() - start,
                      {eng.cfg.name: {**eng.stats, "retractions": eng.scheduler.num_retractions}
                       for eng in engines})


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxserve.bench.fuzz",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=100_000, help="random operations in all")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    report = fuzz(args.ops, args.seed)
    print(report.summary())
    for name, stats in report.per_config.items():
        print(f"  {name}: " + ", ".join(f"{k} {v}" for k, v in stats.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
