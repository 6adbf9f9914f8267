"""`jaxserve.bench.speculative`'s timing protocol: ABBA order, repeats, and compilations during timed passes
are detected (process-wide XLA compiles and the engines' own counters). Fake engines: no model needed."""

from __future__ import annotations

import statistics
import types

import jax
import numpy as np

from jaxserve.bench.speculative import CompileCounter, measure, paired_speedup


class FakeEngine:
    """Engine-shaped: `generate` runs a jitted function; `compile_on` = the calls (1-based) that use a new
    shape (an XLA compile); `fake_compiles_on` = calls that only bump the runner's compile counter."""

    def __init__(self, name: str, log: list, compile_on=(), fake_compiles_on=(), outputs=(1, 2)) -> None:
        self.name, self.log, self.calls, self.flushes = name, log, 0, 0
        self.compile_on, self.fake_compiles_on, self.outputs = set(compile_on), set(fake_compiles_on), outputs
        self.runner = types.SimpleNamespace(num_compiles=0)
        self.num_compiles = {"step": 0}
        self.stats: dict[str, int] = {}
        self.stepper = types.SimpleNamespace()  # a plain engine's stepper: no speculation policy
        self.fn = jax.jit(lambda x: x + 1)

    def flush_cache(self) -> bool:
        self.flushes += 1
        return True

    def generate(self, input_ids, sampling_params):
        self.calls += 1
        self.log.append(self.name)
        size = 3 + self.calls if self.calls in self.compile_on else 3
        self.fn(np.zeros(size + 100 * (self.name == "b"))).block_until_ready()
        if self.calls in self.fake_compiles_on:
            self.runner.num_compiles += 1
            self.num_compiles = {"step": self.runner.num_compiles}
        return [{"output_ids": list(self.outputs)} for _ in input_ids]


def test_compile_counter_counts_new_shapes_only() -> None:
    f = jax.jit(lambda x: x * 3)
    with CompileCounter() as counter:
        f(np.zeros(7)).block_until_ready()
        f(np.zeros(7)).block_until_ready()
        assert counter.count == 1
        f(np.zeros(8)).block_until_ready()
        assert counter.count == 2
    f(np.zeros(9)).block_until_ready()  # unregistered on exit
    assert counter.count == 2


def test_measure_alternates_abba_and_reports_no_compiles_when_warm() -> None:
    log: list[str] = []
    engines = {"a": FakeEngine("a", log), "b": FakeEngine("b", log)}
    with CompileCounter() as counter:
        res = measure(engines, [[1], [2]], 4, 3, counter)
    assert log == ["a", "b", "a", "b", "b", "a", "a", "b"]  # untimed a b, then ABBA...
    for name, r in res.items():
        assert len(r["walls"]) == 3 and r["compiles"] == 0 and r["deterministic"]
        assert engines[name].flushes == 4  # every pass, the untimed one too, starts from an empty cache


def test_measure_detects_compiles_inside_timed_passes() -> None:
    log: list[str] = []
    engines = {"a": FakeEngine("a", log, compile_on={3}), "b": FakeEngine("b", log, fake_compiles_on={2, 4})}
    with CompileCounter() as counter:
        res = measure(engines, [[1]], 4, 3, counter)
    assert res["a"]["compiles"] == 1  # a real XLA compile in a's second timed pass
    assert res["b"]["compiles"] == 2  # only the engine's own counter moved


def test_measure_flags_nondeterministic_passes() -> None:
    log: list[str] = []
    engines = {"a": FakeEngine("a", log)}
    res = measure(engines, [[1]], 4, 2, CompileCounter())
    assert res["a"]["deterministic"]
    calls = iter([(1,), (2,)])  # the untimed pass, the first timed pass, then (3,) for the second
    engines["a"].generate = lambda input_ids, sampling_params: [{"output_ids": list(next(calls, (3,)))}]
    res = measure(engines, [[1]], 4, 2, CompileCounter())
    assert not res["a"]["deterministic"]


def test_paired_speedup_is_the_median_of_each_repeats_own_ratio() -> None:
    # the machine slows down 3x over the run; EAGLE-3 is 1.25x faster within every repeat but the last,
    # whose EAGLE-3 pass caught a fast moment
    drift = [1.0, 1.4, 2.0, 2.6, 3.0]
    plain = list(drift)
    spec = [0.8 * d for d in drift[:4]] + [0.4]
    assert paired_speedup(plain, spec) == sorted(p / s for p, s in zip(plain, spec, strict=True))[2]
    assert abs(paired_speedup(plain, spec) - 1.25) < 1e-12
    assert abs(statistics.median(plain) / statistics.median(spec) - 1.25) > 0.5  # the medians mislead here
    assert paired_speedup([1.0, 2.0, 3.0], [2.0, 2.0, 2.0]) == 1.0
