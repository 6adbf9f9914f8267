"""The cache benchmark runs, and on a workload small enough that nothing is evicted our tree matches exactly
as many slots as the naive per-token trie (an independent implementation of the same semantics)."""

from __future__ import annotations

import pytest

from jaxserve.bench import cache as bench


@pytest.mark.parametrize(("page_size", "eagle"), [(1, False), (1, True), (16, False), (16, True)])
def test_tree_and_naive_trie_match_the_same_slots(page_size: int, eagle: bool) -> None:
    requests = bench.make_workload(60, seed=3)
    assert sum(r.shape[0] for r in requests) < bench.POOL_SLOTS  # no eviction: the two must agree exactly
    ours = bench.run_tree("full", page_size, eagle, requests)
    naive = bench.run_naive(page_size, eagle, requests)
    assert ours.matched_slots == naive.matched_slots > 0


def test_bench_cli_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    bench.main(["--requests", "20", "--trees", "full", "--page-sizes", "1"])
    out = capsys.readouterr().out
    assert "full   1 False" in out and "full   1 True" in out and "4,096 tokens / 64 nodes" in out
