"""The cache benchmark: our whole request path, the SGLang-style baseline and the naive per-token trie reuse
exactly as many slots when nothing is evicted (three independent implementations of the same matching
rule); under eviction pressure every path keeps each slot in exactly one place (free, or one tree node)."""

from __future__ import annotations

import numpy as np
import pytest

from jaxserve.bench import cache as bench

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

ROWS = [(kind, p, e) for kind in ("full", "swa") for p in (1, 16) for e in (False, True)]


@pytest.mark.parametrize(("kind", "page_size", "eagle"), ROWS)
def test_ours_sglang_style_and_naive_reuse_the_same_slots(kind: str, page_size: int, eagle: bool) -> None:
    requests = bench.make_workload(60, seed=3)
    assert sum(r.shape[0] for r in requests) < bench.POOL_SLOTS  # no eviction: the three must agree exactly
    ours = bench.run_ours(kind, page_size, eagle, requests)
    sgl = bench.run_sglang_style(kind, page_size, eagle, requests)
    naive = bench.run_naive(page_size, eagle, requests)
    assert ours.matched_slots == sgl.matched_slots == naive.matched_slots > 0
    tree_only = bench.run_ours_tree_only(kind, page_size, eagle, requests)
    sgl_tree_only = bench.run_sglang_style_tree_only(kind, page_size, eagle, requests)
    assert tree_only.matched_slots == sgl_tree_only.matched_slots > 0


def _baseline_slots(tree) -> np.ndarray:
    """Every slot the SGLang-style tree holds, plus its allocator's free ones (full side)."""
    values, stack = [], [tree.root]
    while stack:
        node = stack.pop()
        values.append(node.value)
        stack.extend(node.children.values())
    alloc = tree.allocator
    free = alloc.full.free_pages if hasattr(alloc, "full") else alloc.free_pages
    if tree.page_size > 1 and not hasattr(alloc, "full"):
        free = (free[:, None] * tree.page_size + np.arange(tree.page_size)).reshape(-1)
    return np.sort(np.concatenate([*values, free]))


@pytest.mark.parametrize(("kind", "page_size", "eagle"), ROWS)
def test_every_slot_has_one_owner_under_eviction(
    monkeypatch: pytest.MonkeyPatch, kind: str, page_size: int, eagle: bool
) -> None:
    monkeypatch.setattr(bench, "POOL_SLOTS", 2**13)
    requests = bench.make_workload(40, seed=5)
    assert sum(r.shape[0] for r in requests) > 2 * bench.POOL_SLOTS  # the trees must evict
    tree = bench.make_tree(kind, page_size, eagle)
    for prompt in requests:  # `run_ours`'s loop body, with the ownership check after every request
        bench.run_ours_request(tree, prompt, np.append(prompt, 0))
        tree.check_invariants()
    baseline = (bench.SGLangStyleTree if kind == "full" else bench.SGLangStyleSWATree)(page_size, eagle)
    for prompt in requests:
        baseline.run_request(prompt.tolist())
    usable = bench.POOL_SLOTS // page_size * page_size if kind == "full" else bench.POOL_SLOTS
    first = page_size if kind == "full" else 1
    assert np.array_equal(_baseline_slots(baseline), np.arange(first, first + usable))


def test_bench_cli_prints_same_run_ratios(capsys: pytest.CaptureFixture[str]) -> None:
    bench.main(["--requests", "20", "--trees", "full", "--page-sizes", "1"])
    out = capsys.readouterr().out
    assert "full   1 False" in out and "full   1 True" in out and "4,096 tokens / 64 nodes" in out
    assert "x sgl" in out and "whole request path" in out
    for line in (ln for ln in out.splitlines() if ln.startswith("full   1 ")):
        ours, _, real = (part.split() for part in line.split("|")[1:4])
        assert real[1] == ours[2] and float(real[2]) > 0  # SGLang's own tree reused the same slots
    bench.main(["--requests", "20", "--trees", "swa", "--page-sizes", "16", "--tree-only"])
    out = capsys.readouterr().out
    assert "swa   16 False" in out and "match_prefix + insert only" in out
