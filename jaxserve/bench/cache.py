"""Prefix-cache benchmark: the shared-prefix workload of the reference doc's Appendix B.

    python -m jaxserve.bench.cache                 # 2,000 requests, all rows (a few minutes on one core)
    python -m jaxserve.bench.cache --requests 200  # quick run

Workload: N requests of 200-2,000 tokens, each a random 10-100% prefix of one of 50 random 2,000-token
"system prompts" plus a random suffix. Per request one `match_prefix(tokens)` and one `insert` of the
page-floored tokens (EAGLE: `n` tokens carry `n - 1` bigram units) with fresh slots from a checked allocator
of 2^19 slots (W = 512 for the SWA tree). Only the two tree calls are timed, including key validation (and,
for the SWA tree, the frees it does itself); allocation, the caller's duplicate frees, and the evictions that
keep the pool from running dry (as a scheduler would) are outside the timed region, as in Appendix B.
The baseline is a naive trie with one dict per token (a Python loop over tokens, no eviction, no allocator),
run on the same requests in the same process; the ratio column is tree / baseline match+insert ops/s.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from cache import RadixCache
from cache.testing import CheckedAllocator, CheckedSWAAllocator

POOL_SLOTS = 2**19
# CPU time of this process: on a shared machine wall time also counts other processes' turns. On an idle
# machine the two agree (one thread); `--wall-clock` switches.
CLOCK = time.process_time
SLIDING_WINDOW = 512
SGLANG_MATCH_INSERT_OPS = {  # Appendix B, match+insert ops/s of SGLang 0.5.3.post1 on CPU
    ("full", 1, False): 1927.7, ("full", 1, True): 1020.5, ("full", 16, False): 2512.6,
    ("full", 16, True): 961.7, ("swa", 1, False): 336.7, ("swa", 1, True): 262.7,
    ("swa", 16, False): 362.6, ("swa", 16, True): 255.0,
}  # fmt: skip


def make_workload(num_requests: int, seed: int = 0, num_prompts: int = 50, prompt_tokens: int = 2000,
                  vocab: int = 32000) -> list[np.ndarray]:  # fmt: skip
    """The requests' token ids (int64 arrays), deterministic in `seed`."""
    rng = np.random.default_rng(seed)
    prompts = rng.integers(0, vocab, (num_prompts, prompt_tokens), dtype=np.int64)
    requests = []
    for _ in range(num_requests):
        num_tokens = int(rng.integers(200, 2001))
        shared = min(int(rng.uniform(0.1, 1.0) * prompt_tokens), num_tokens)
        suffix = rng.integers(0, vocab, num_tokens - shared, dtype=np.int64)
        requests.append(np.concatenate([prompts[rng.integers(num_prompts)][:shared], suffix]))
    return requests


def insert_units(num_tokens: int, page_size: int, eagle: bool) -> int:
    """Units (= slots) an insert of a request of `num_tokens` stores: page-floored, one fewer under EAGLE."""
    units = max(num_tokens - eagle, 0)
    return units - units % page_size


@dataclass
class RowResult:
    match_s: float
    insert_s: float
    matched_slots: int
    num_requests: int
    num_tokens: int

    def ops(self, seconds: float) -> float:
        return self.num_requests / seconds

    def toks(self, seconds: float) -> float:
        return self.num_tokens / seconds


def run_tree(kind: str, page_size: int, eagle: bool, requests: list[np.ndarray]) -> RowResult:
    """Time one match + one insert per request on our tree of `kind` ('full' or 'swa')."""
    if kind == "full":
        alloc = CheckedAllocator(POOL_SLOTS, page_size)
        tree = RadixCache(alloc, page_size=page_size, eagle=eagle)
        available = alloc.available_size
    else:
        from cache.swa_radix_cache import SWARadixCache

        alloc = CheckedSWAAllocator(POOL_SLOTS, POOL_SLOTS, page_size)
        tree = SWARadixCache(alloc, sliding_window=SLIDING_WINDOW, page_size=page_size, eagle=eagle)

        def available() -> int:
            return min(alloc.full_available_size(), alloc.swa_available_size())

    match_s = insert_s = 0.0
    matched = 0
    clock = CLOCK
    for tokens in requests:
        t0 = clock()
        slots, _ = tree.match_prefix(tokens)
        match_s += clock() - t0
        matched += slots.shape[0]
        units = insert_units(tokens.shape[0], page_size, eagle)
        if units == 0:
            continue
        if available() < units:
            if kind == "full":
                tree.evict(units)
            else:
                tree.evict(units, units)
        new_slots = alloc.alloc(units)
        t0 = clock()
        num_cached = tree.insert(tokens[: units + eagle], new_slots)
        insert_s += clock() - t0
        if kind == "full" and num_cached:
            alloc.free(new_slots[:num_cached])  # the caller's duplicates (the SWA tree frees its own)
    return RowResult(match_s, insert_s, matched, len(requests), sum(t.shape[0] for t in requests))


class NaiveTrie:
    """Baseline: one dict per unit, a Python loop over units. Node = [children dict, slot]."""

    def __init__(self, page_size: int, eagle: bool) -> None:
        self.page_size, self.eagle = page_size, eagle
        self.root: dict = {}
        self.next_slot = 1

    def _units(self, tokens: np.ndarray) -> list:
        ids = tokens.tolist()
        units = list(pairwise(ids)) if self.eagle else ids
        return units[: len(units) - len(units) % self.page_size]

    def match(self, tokens: np.ndarray) -> list[int]:
        node, out = self.root, []
        for unit in self._units(tokens):
            entry = node.get(unit)
            if entry is None:
                break
            out.append(entry[1])
            node = entry[0]
        return out[: len(out) - len(out) % self.page_size]

    def insert(self, tokens: np.ndarray) -> int:
        node, num_cached = self.root, 0
        for unit in self._units(tokens):
            entry = node.get(unit)
            if entry is None:
                entry = node[unit] = [{}, self.next_slot]
                self.next_slot += 1
            else:
                num_cached += 1
            node = entry[0]
        return num_cached


def run_naive(page_size: int, eagle: bool, requests: list[np.ndarray]) -> RowResult:
    trie = NaiveTrie(page_size, eagle)
    match_s = insert_s = 0.0
    matched = 0
    clock = CLOCK
    for tokens in requests:
        t0 = clock()
        matched += len(trie.match(tokens))
        match_s += clock() - t0
        t0 = clock()
        trie.insert(tokens)
        insert_s += clock() - t0
    return RowResult(match_s, insert_s, matched, len(requests), sum(t.shape[0] for t in requests))


def time_per_call(fn: Callable[[], object], repeats: int) -> float:
    t0 = CLOCK()
    for _ in range(repeats):
        fn()
    return (CLOCK() - t0) / repeats


def scaling_rows(repeats: int = 2000) -> list[str]:
    """Match cost of cached prompts: 64 vs 4,096 tokens in one node each (cost should barely move), and
    4,096 tokens split over 64 nodes (cost grows with nodes visited); the naive trie for contrast."""
    rng = np.random.default_rng(1)
    alloc = CheckedAllocator(POOL_SLOTS, 1)
    tree, trie = RadixCache(alloc), NaiveTrie(1, False)
    short, long = rng.integers(0, 32000, 64), rng.integers(32000, 64000, 4096)
    split = rng.integers(64000, 96000, 4096)
    for prompt in (short, long, split):
        tree.insert(prompt, alloc.alloc(prompt.shape[0]))
        trie.insert(prompt)
    for end in range(64, 4096, 64):  # a branch every 64 tokens cuts `split` into 64 nodes
        branch = np.concatenate([split[:end], [7]])
        if num_cached := tree.insert(branch, slots := alloc.alloc(end + 1)):
            alloc.free(slots[:num_cached])
    ours = [time_per_call(lambda p=p: tree.match_prefix(p), repeats) for p in (short, long, split)]
    naive = [time_per_call(lambda p=p: trie.match(p), max(repeats // 10, 1)) for p in (short, long)]
    return [
        f"match of a cached prompt: 64 tokens / 1 node {ours[0] * 1e6:.1f} us, 4,096 tokens / 1 node "
        f"{ours[1] * 1e6:.1f} us (x{ours[1] / ours[0]:.2f}), 4,096 tokens / 64 nodes {ours[2] * 1e6:.1f} us "
        f"(x{ours[2] / ours[0]:.1f})",
        f"naive trie: 64 tokens {naive[0] * 1e6:.1f} us, 4,096 tokens {naive[1] * 1e6:.1f} us "
        f"(x{naive[1] / naive[0]:.1f})",
    ]


def swa_available() -> bool:
    try:
        from cache.swa_radix_cache import SWARadixCache  # noqa: F401
    except ImportError as exc:
        print(f"SWA tree not importable: {exc}")
        return False
    return True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="number of requests (default 2000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trees", default="full,swa", help="comma-separated subset of full,swa")
    parser.add_argument("--page-sizes", default="1,16", help="comma-separated page sizes")
    parser.add_argument("--no-baseline", action="store_true", help="skip the naive trie (no ratio column)")
    parser.add_argument("--wall-clock", action="store_true", help="time with perf_counter, not CPU time")
    args = parser.parse_args(argv)
    global CLOCK
    CLOCK = time.perf_counter if args.wall_clock else time.process_time
    requests = make_workload(args.requests, args.seed)
    print(f"workload: {len(requests)} requests, {sum(t.shape[0] for t in requests):,} tokens, "
          f"pool {POOL_SLOTS} slots, W={SLIDING_WINDOW}, clock={CLOCK.__name__}")  # fmt: skip
    trees = args.trees.split(",")
    if "swa" in trees and not swa_available():
        print("SWA rows skipped: cache/swa_radix_cache.py is not there yet")
        trees.remove("swa")
    header = (
        f"{'tree':4} {'P':>3} {'EAGLE':5} | {'match ops/s':>11} {'insert ops/s':>12} {'m+i ops/s':>10} "
        f"{'m+i tok/s':>11} {'matched':>10} | {'x SGLang':>8} | {'naive ops/s':>11} {'x naive':>7}"
    )
    print(header + "\n" + "-" * len(header))
    baselines: dict[tuple[int, bool], RowResult] = {}
    for kind in trees:
        for page_size in (int(p) for p in args.page_sizes.split(",")):
            for eagle in (False, True):
                row = run_tree(kind, page_size, eagle, requests)
                both = row.match_s + row.insert_s
                sglang = SGLANG_MATCH_INSERT_OPS.get((kind, page_size, eagle))
                vs_sglang = f"{row.ops(both) / sglang:8.1f}" if sglang else f"{'-':>8}"
                naive = ""
                if not args.no_baseline:
                    if (page_size, eagle) not in baselines:
                        baselines[page_size, eagle] = run_naive(page_size, eagle, requests)
                    base = baselines[page_size, eagle]
                    base_ops = base.ops(base.match_s + base.insert_s)
                    naive = f"{base_ops:11.1f} {row.ops(both) / base_ops:7.1f}"
                print(f"{kind:4} {page_size:3d} {eagle!s:5} | {row.ops(row.match_s):11.1f} "
                      f"{row.ops(row.insert_s):12.1f} {row.ops(both):10.1f} {row.toks(both):11,.0f} "
                      f"{row.matched_slots:10,d} | {vs_sglang} | {naive}")  # fmt: skip
    print(*scaling_rows(), sep="\n")


if __name__ == "__main__":
    main()
