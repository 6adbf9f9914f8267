"""`python -m jaxserve.bench.compile` runs end to end on a tiny depth pair and reports both forms."""

from jaxserve.bench.compile import main, run


def test_compile_bench_reports_both_forms(capsys):
    result = run("llama", [2, 4], tokens=16, seqs=1, pages=2)
    assert [r["layers"] for r in result["rows"]] == [2, 4]
    assert all(r["unrolled_s"] > 0 and r["scan_s"] > 0 for r in result["rows"])
    assert result["ratio_scan"] == round(result["rows"][1]["scan_s"] / result["rows"][0]["scan_s"], 2)
    main(["--layers", "2", "4", "--tokens", "16", "--seqs", "1", "--pages", "2"])
    assert "ratio 4/2 layers: scan" in capsys.readouterr().out
