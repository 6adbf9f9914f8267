"""`python -m jaxserve.bench.attention`: one run prints, per backend, every row of the grid with its time,
KV bytes/s, the ratio to the copy bandwidth measured in that run and the ratio to native; rows the budget
or the memory cap rule out are printed as skipped, with the reason."""

import re

import pytest

from jaxserve.bench import attention


def _table(out: str) -> dict[tuple[str, str], list[str]]:
    """{(row label, backend): cells after the backend} of the printed table."""
    rows = {}
    for line in out.splitlines():
        m = re.match(r"((?:decode|mixed) \d+x\S+)\s+(\S+)\s+(.*)$", line)
        if m:
            rows[m.group(1), m.group(2)] = m.group(3).split()
    return rows


@pytest.mark.slow
def test_quick_run_prints_every_row_with_consistent_columns(capsys):
    attention.main(["--quick", "--repeats", "1", "--backends", "native", "xla"])
    out = capsys.readouterr().out
    bandwidth = float(re.search(r"copy bandwidth: ([\d.]+) GB/s", out).group(1)) * 1e9
    assert out.splitlines()[2].split() == ["row", "backend", "ms", "GB/s", "of", "copy", "x", "native"]
    table = _table(out)
    layout = attention.llama_layout("cpu")
    labels = [label for label, _ in attention.timing_rows(attention.QUICK)]
    assert set(table) == {(label, name) for label in labels for name in ("native", "xla")}
    for label, seqs in attention.timing_rows(attention.QUICK):
        for name in ("native", "xla"):
            ms, gbs, of_copy, x_native = map(float, table[label, name])
            want_gbs = attention.kv_bytes(layout, seqs) / (ms / 1e3) / 1e9
            assert gbs == pytest.approx(want_gbs, rel=1e-2)  # ms printed to 4 significant digits, GB/s to 3
            assert of_copy == pytest.approx(gbs * 1e9 / bandwidth, rel=2e-2)
            native_ms = float(table[label, "native"][0])
            assert x_native == pytest.approx(native_ms / ms, rel=2e-2, abs=6e-3)
    assert "skipped" not in out


def test_budget_and_memory_cap_skip_rows_and_say_why(monkeypatch, capsys):
    """Each timed call 'takes' one second: the budget admits the two 64-token rows, then predicts the
    1,024-token rows (16x the KV bytes) past what is left; a memory cap skips rows before any timing."""
    monkeypatch.setattr(attention, "time_call", lambda *args, **kwargs: 1.0)
    layout = attention.Layout("tiny", 4, 2, 16)
    sizes = attention.Sizes(batches=(1,), contexts=(64, 1024), chunk=16)
    got = attention.bench(["native"], layout, sizes=sizes, repeats=1, budget_s=10, bandwidth=1e9)
    out = capsys.readouterr().out
    assert set(got) == {("decode 1x64", "native"), ("mixed 1x64", "native")}
    assert re.search(r"decode 1x1k\s+native\s+skipped: predicted 32 s > \d+ s left of --budget-s", out)
    assert "skipped (2): decode 1x1k native: predicted 32 s" in out

    kv_64 = attention.kv_bytes(layout, [attention.Seq(63, 1)])
    got = attention.bench(["native"], layout, sizes=sizes, repeats=1, budget_s=10, bandwidth=1e9,
                          max_kv_gb=kv_64 / 1e9)
    out = capsys.readouterr().out
    assert len(got) == 2 and re.search(r"mixed 1x1k\s+all\s+skipped: KV [\d.]+ GB > --max-kv-gb", out)

    assert attention.bench(["native"], layout, sizes=sizes, budget_s=0, bandwidth=1e9) == {}
    assert capsys.readouterr().out.count("skipped: --budget-s 0 spent") == 4
