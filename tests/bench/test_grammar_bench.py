"""`python -m jaxserve.bench.grammar` runs end to end: constrained outputs checked against the regex, no
compilation inside the timed passes (every pass starts from an empty prefix cache, warm-up included), the
xgrammar backend's batch beside llguidance's."""

import pytest

from jaxserve.bench.grammar import main


@pytest.mark.slow
def test_grammar_bench_times_only_compiled_shapes(capsys):
    result = main(["--batch", "4", "--max-new-tokens", "12", "--repeats", "2", "--xgrammar"])
    assert result["compiles_during_timing"] == 0
    kinds = ("plain", "plain_sync", "regex", "regex_sync", "regex_xgrammar")
    assert all(result[f"{k}_tok_s"] > 0 for k in kinds)
    assert result["regex_over_plain"] > 0 and result["regex_xgrammar_over_regex"] > 0
    assert "0 compilations during the timed passes" in capsys.readouterr().out
