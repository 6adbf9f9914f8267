"""`python -m jaxserve.bench.device` (its serving stage) is ready for an accelerator: `--tiny` runs every
serving benchmark here at tiny sizes, and the summary judges each figure against its target as the target
says (checked by re-reading the printed table, not by trusting the verdicts)."""

from __future__ import annotations

import re

import pytest

from jaxserve.bench import device, serving_lines

ROW = re.compile(r"^(\S+) +(.+?) +(\S*) +(>=|<=|yes) ?(\S*)  (met|NOT met)(?:  \((.*)\))?$")


def _judge(figure: str, op: str, bound: str) -> bool:
    if op == "yes":
        return True  # a yes/no line: the verdict is the figure
    value, limit = float(figure), float(bound)
    return value >= limit if op == ">=" else value <= limit


@pytest.mark.slow  # builds the engines of five benchmarks
def test_serving_stage_runs_every_benchmark_and_judges_each_line(capsys):
    device.main(["--tiny"])
    out = capsys.readouterr().out
    table = out[out.rindex("\nstage "):].splitlines()[2:]  # the final table (each stage's came before)
    rows = [ROW.match(line) for line in table if not line.startswith("serving total")]
    assert all(rows), [line for line, row in zip(table, rows, strict=False) if not row]
    stages = [row[1] for row in rows]
    assert stages == ["speculative"] * 8 + ["round_host_served"] * 2 + ["round_host_embedded"] * 2 + [
        "grammar"] + ["host_cost"] * 2  # tiny: batches 1 and 4, four lines each
    for row in rows:
        _stage, _what, figure, op, bound, verdict, _remark = row.groups()
        assert (verdict == "met") == _judge(figure, op, bound), row[0]
    identical = [row for row in rows if row[2].startswith("outputs identical")]
    assert [row[6] for row in identical] == ["met", "met"]  # EAGLE-3 is lossless at every batch
    assert "random embedded shapes" in out and "no accelerator" not in out
    assert out.count("\nstage ") == 6  # each stage's table as it ended, then all of them


def test_budget_skips_later_stages_and_a_failing_stage_does_not_stop_the_rest(monkeypatch):
    calls = []

    def boom(options: serving_lines.Options) -> list[serving_lines.Line]:
        calls.append("boom")
        raise RuntimeError("out of device memory")

    def fine(options: serving_lines.Options) -> list[serving_lines.Line]:
        calls.append("fine")
        return [serving_lines.Line("grammar", "x", 0.95, ">= 0.9", True)]

    monkeypatch.setitem(serving_lines.STAGES, "speculative", boom)
    monkeypatch.setitem(serving_lines.STAGES, "grammar", fine)
    lines = serving_lines.run(serving_lines.Options(tiny=True), stages=("speculative", "grammar"))
    assert calls == ["boom", "fine"]
    assert lines[0].met is None and lines[0].remark == "FAILED RuntimeError: out of device memory"
    assert lines[1].value == 0.95
    lines = serving_lines.run(serving_lines.Options(tiny=True), budget_s=-1.0,
                              stages=("speculative", "grammar"))
    assert calls == ["boom", "fine"] and all(ln.remark.startswith("skipped") for ln in lines)
    seen = []  # --served-layers reaches the served-shapes stage's model
    monkeypatch.setattr(serving_lines, "_round_host", lambda stage, argv: seen.append(argv) or [])
    serving_lines.run(serving_lines.Options(served_layers=12), stages=("round_host_served",))
    assert seen == [["--random-layers", "12", "--batch-size", "32", "--repeats", "3"]]
    with pytest.raises(ValueError, match="unknown serving stages"):
        serving_lines.run(stages=("grammar", "kernels"))
    assert "NOT met" in serving_lines.summary([serving_lines.Line("s", "w", 1.3, "<= 1.2", False)])


def test_on_a_cpu_without_tiny_the_serving_stage_says_it_judges_nothing(capsys):
    device.main([])
    assert "no accelerator: the serving targets are judged on a TPU or GPU" in capsys.readouterr().out
