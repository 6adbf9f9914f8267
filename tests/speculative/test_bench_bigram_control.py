"""Smoke test of `jaxserve.bench.bigram_control` (tiny arguments; too small to show the effect)."""

from __future__ import annotations

import json

import pytest

from jaxserve.bench.bigram_control import main

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it


def test_bigram_control_bench_runs(capsys):
    results = main(["--source", "docstrings", "--families", "3", "--min-tokens", "8", "--max-tokens", "8",
                    "--new-tokens", "4", "--rounds", "1", "2"])
    assert list(results) == [("docstrings", 8, 4)]
    row = results[("docstrings", 8, 4)]
    assert row["families"] == 3 and row["cached_positions"] == 3 * (8 - 2)  # positions 0 .. len - 3
    assert 0 <= row["agreement_token"] <= 1 and 0 <= row["agreement_bigram"] <= 1
    assert row["identical_outputs"]  # greedy: the draft KV changes acceptance, never the tokens
    assert set(row["acc_length"]) == {"1", "2", "all"}
    for stats in row["acc_length"].values():
        assert stats["wins"] + stats["ties"] + stats["losses"] == 3
        assert abs(stats["bigram"] - stats["token"] - stats["diff_mean"]) < 1e-3
        assert stats["bigram"] >= 1 and stats["token"] >= 1
    lines = capsys.readouterr().out.splitlines()
    assert json.loads(lines[0])["acc_length"] == row["acc_length"]
