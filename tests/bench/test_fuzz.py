"""The host-side fuzzer (`jaxserve.bench.fuzz`): 100k random operations over every configuration keep every
ownership and correctness rule, and the fuzzer's checks do catch broken ones (a freed slot still in use, KV
overwritten under a cached prefix, a lost output token)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from jaxserve.bench import fuzz as fz

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it


def test_100k_ops_over_every_configuration_keep_every_rule():
    report = fz.fuzz(100_000, seed=20261202)
    assert report.num_ops == 100_000
    names = {cfg.name for cfg in fz.CONFIGS}
    assert set(report.per_config) == names
    assert {"full-p1", "swa-p4", "full-p16-eagle", "swa-p16-eagle", "full-p4-noradix"} <= names
    for name, stats in report.per_config.items():
        assert stats["finished"] > 50 and stats["aborted"] > 0, (name, stats)
        if "eagle" in name:
            assert stats["rounds"] > 0, (name, stats)
    totals = {k: sum(s[k] for s in report.per_config.values()) for k in ("retractions", "flushes")}
    assert totals["retractions"] > 0 and totals["flushes"] > 0, totals


def _busy_engine(cfg: fz.FuzzConfig, seed: int = 3) -> fz.EngineUnderTest:
    """An engine with running requests that hold private slots and a tree with cached prefixes."""
    eng = fz.EngineUnderTest(cfg, np.random.default_rng(seed))
    for _ in range(40):
        eng.arrive()
        eng.step()
        eng.check()
    for _ in range(4):
        eng.arrive()
    eng.step()
    eng.check()
    return eng


@pytest.mark.parametrize("cfg", [fz.FuzzConfig(page_size=1, num_pages=96),
                                 fz.FuzzConfig(page_size=4, num_pages=24, hybrid=True)], ids=lambda c: c.name)
def test_a_slot_freed_while_a_request_holds_it_is_caught(cfg):
    eng = _busy_engine(cfg)
    req = next(r for r in eng.scheduler.running
               if r.cached.kv_slots.shape[0] > r.cached.last_matched_prefix_len)
    page_start = int(req.cached.kv_slots[-1]) // cfg.page_size * cfg.page_size
    eng.kv.allocator.free(np.arange(page_start, page_start + cfg.page_size))
    with pytest.raises(fz.InvariantViolation):
        eng.check()


def test_kv_overwritten_under_a_cached_prefix_is_caught_when_read():
    cfg = fz.FuzzConfig(page_size=4, num_pages=24)
    eng = _busy_engine(cfg)
    req = next(r for r in eng.scheduler.running if r.num_computed > 1)
    eng.pool_tokens[req.cached.kv_slots[0]] = -7  # another writer clobbered position 0's KV
    with pytest.raises(fz.InvariantViolation, match="reads KV"):
        for _ in range(50):
            eng.step()


def test_a_lost_output_token_is_caught_at_finish(monkeypatch):
    cfg = fz.FuzzConfig(page_size=1, num_pages=96)
    eng = fz.EngineUnderTest(cfg, np.random.default_rng(5))
    real = fz.solo_output
    monkeypatch.setattr(fz, "solo_output", lambda key, n: [*real(key, n), 0])  # the reference has one more
    eng.arrive()
    with pytest.raises(fz.InvariantViolation, match="!= solo"):
        for _ in range(100):
            eng.step()
            eng.drain()


def test_cli_prints_a_zero_violation_summary(capsys):
    assert fz.main(["--ops", "2000", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("2000 ops over ") and "0 violations" in out


def test_a_run_is_the_same_in_every_process():
    """The stand-in's outputs, and so a whole run, depend only on the seed (not on Python's per-process
    string hashing): two processes with different hash seeds print the same per-configuration figures."""
    runs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        done = subprocess.run([sys.executable, "-m", "jaxserve.bench.fuzz", "--ops", "3000", "--seed", "4"],
                              capture_output=True, text=True, timeout=300, env=env, check=True)
        runs.append(done.stdout.splitlines()[1:])  # the first line carries the run's seconds
    assert runs[0] == runs[1] and len(runs[0]) == len(fz.CONFIGS)


def test_the_vectorised_stand_in_equals_the_scalar_one():
    keys = [0, 1, 0xFFFFFFFF, *np.random.default_rng(0).integers(0, 1 << 32, size=50).tolist()]
    for key in keys:
        scalar = [fz.stand_in_token(key, i) for i in range(64)]
        assert fz.stand_in_tokens(key, np.arange(64)).tolist() == scalar
