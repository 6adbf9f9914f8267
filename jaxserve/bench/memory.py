"""KV-memory benchmark: donated pool writes, peak memory, allocator op costs.

    python -m jaxserve.bench.memory           # 2^14 and 2^18 tokens x 32 layers (2 GiB + a 2 GiB copy)
    python -m jaxserve.bench.memory --small   # 2^12 and 2^16 tokens

(a) Time of one 64-token KV write (bf16 K/V, uint16 storage), per layer (`write_kv_donated`) and for all
    layers at once (`write_kv_all_layers_donated`), donated vs not donated, for a small and a 16x larger pool.
    Heads are small so the large pool fits beside other work: 1 KV head x 64 dims (K+V = 256 B per token per
    layer; 2^18 tokens x 32 layers = 2 GiB). The non-donated writes must copy the pool on every call.
(b) Peak resident memory (VmHWM) of a fresh process per pool size, measured after the steady donated writes
    and before any non-donated call, against the pool's bytes and against the process's baseline RSS.
(c) Allocator costs in microseconds per op at 2^14 and 2^20 slots, at 50% occupancy: alloc + free of 64
    slots (token allocator, paged P=16, SWA), backup (keep the state) and restore (facade set + stale check).
Every figure is a median over repeated calls in one run; compare ratios, not absolute times, across machines.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import deque

import numpy as np

LAYERS, KV_HEADS, HEAD_DIM, WRITE_TOKENS, PAGE_SIZE = 32, 1, 64, 64, 16


def _vm_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _median_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


def write_child(log2_tokens: int, copy_reps: int) -> dict:
    """Run in a fresh process: time donated / non-donated writes into one pool; report peak memory."""
    import jax
    import jax.numpy as jnp

    from jaxserve.memory import kv_pool, make_kv_pool, write_kv_all_layers_donated, write_kv_donated

    baseline_kib = _vm_kib("VmRSS")
    num_pages = 2**log2_tokens // PAGE_SIZE - 1  # (num_pages + 1) * page_size == 2^log2 slots
    pool = make_kv_pool(LAYERS, num_pages, PAGE_SIZE, KV_HEADS, HEAD_DIM, jnp.bfloat16)
    pool.data.block_until_ready()
    rng = np.random.default_rng(0)
    real_slots = np.arange(PAGE_SIZE, pool.num_slots)  # everything but the padding page
    slot_sets = [
        jax.device_put(rng.choice(real_slots, WRITE_TOKENS, replace=False).astype(np.int32)) for _ in range(8)
    ]
    k = jax.device_put(rng.normal(size=(WRITE_TOKENS, KV_HEADS, HEAD_DIM)).astype(jnp.bfloat16))
    k_all = jax.device_put(rng.normal(size=(LAYERS, WRITE_TOKENS, KV_HEADS, HEAD_DIM)).astype(jnp.bfloat16))
    layer = jax.device_put(np.int32(3))
    state = {"pool": pool, "i": 0}

    def donated_layer():
        state["i"] += 1
        state["pool"] = write_kv_donated(state["pool"], layer, slot_sets[state["i"] % 8], k, k)
        state["pool"].data.block_until_ready()

    def donated_all():
        state["i"] += 1
        state["pool"] = write_kv_all_layers_donated(state["pool"], slot_sets[state["i"] % 8], k_all, k_all)
        state["pool"].data.block_until_ready()

    for fn in (donated_layer, donated_all):
        fn()  # compile
    out = {"log2_tokens": log2_tokens, "pool_bytes": state["pool"].nbytes, "baseline_kib": baseline_kib}
    out["donated_layer_ms"] = _median_ms(donated_layer, 50)
    out["donated_all_ms"] = _median_ms(donated_all, 30)
    out["peak_kib_donated"] = _vm_kib("VmHWM")
    copy_layer = jax.jit(kv_pool.write_kv)
    copy_all = jax.jit(kv_pool.write_kv_all_layers)
    fixed = state["pool"]

    def copied_layer():
        copy_layer(fixed, layer, slot_sets[0], k, k).data.block_until_ready()

    def copied_all():
        copy_all(fixed, slot_sets[0], k_all, k_all).data.block_until_ready()

    for fn in (copied_layer, copied_all):
        fn()
    out["copy_layer_ms"] = _median_ms(copied_layer, copy_reps)
    out["copy_all_ms"] = _median_ms(copied_all, copy_reps)
    out["peak_kib_after_copies"] = _vm_kib("VmHWM")
    return out


def _alloc_bench(make, alloc, free, ops: int, rng) -> float:
    """Microseconds per (alloc 64 + free 64) pair at ~50% occupancy, median of 5 batches."""
    state = make()
    live: deque[np.ndarray] = deque()
    while len(live) * WRITE_TOKENS * 2 < _total_slots(state):  # fill to half
        state, slots = alloc(state, WRITE_TOKENS)
        live.append(slots)
    order = rng.permutation(len(live))
    live = deque(live[i] for i in order)
    per_batch = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(ops):
            state = free(state, live.popleft())
            state, slots = alloc(state, WRITE_TOKENS)
            live.append(slots)
        per_batch.append((time.perf_counter() - t0) * 1e6 / ops)
    return float(np.median(per_batch))


def _total_slots(state) -> int:
    return getattr(state, "full", state).num_slots


def allocator_rows(log2_slots: int, ops: int) -> dict:
    from jaxserve.memory import AllocatorFacade, allocator, make_allocator, make_swa_allocator, swa_allocator

    rng = np.random.default_rng(1)
    n = 2**log2_slots
    row = {"log2_slots": log2_slots}
    row["token alloc+free"] = _alloc_bench(
        lambda: make_allocator(n, 1), allocator.alloc, allocator.free, ops, rng
    )
    row["paged(16) alloc+free"] = _alloc_bench(
        lambda: make_allocator(n // 16, 16), allocator.alloc, allocator.free, ops, rng
    )
    row["swa alloc+free"] = _alloc_bench(
        lambda: make_swa_allocator(n, n // 2, 1), swa_allocator.alloc, swa_allocator.free, ops, rng
    )
    facade = AllocatorFacade(make_allocator(n, 1))
    for _ in range(n // (2 * WRITE_TOKENS)):
        facade.alloc(WRITE_TOKENS)
    reps = 20000
    t0 = time.perf_counter()
    for _ in range(reps):
        saved = facade.state
    row["backup"] = (time.perf_counter() - t0) * 1e6 / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        facade.state = saved
    row["restore"] = (time.perf_counter() - t0) * 1e6 / reps
    t0 = time.perf_counter()
    for _ in range(2000):  # the speculative pattern: backup, allocate draft slots, restore
        saved = facade.state
        facade.alloc(WRITE_TOKENS)
        facade.state = saved
    row["backup+alloc64+restore"] = (time.perf_counter() - t0) * 1e6 / 2000
    return row


def _run_child(log2: int, copy_reps: int) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "jaxserve.bench.memory",
        "--child-write",
        str(log2),
        "--copy-reps",
        str(copy_reps),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="2^12 vs 2^16 token pools")
    parser.add_argument("--child-write", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--copy-reps", type=int, default=5, help="repetitions of the non-donated writes")
    parser.add_argument("--alloc-ops", type=int, default=2000, help="alloc+free pairs per timing batch")
    args = parser.parse_args(argv)
    if args.child_write is not None:
        print(json.dumps(write_child(args.child_write, args.copy_reps)))
        return
    small, large = (12, 16) if args.small else (14, 18)
    rows = [_run_child(log2, args.copy_reps) for log2 in (small, large)]
    _print_writes(rows)
    _print_memory(rows)
    print("\n(c) allocator microseconds per op, 50% occupancy")
    arows = [allocator_rows(log2, args.alloc_ops) for log2 in (14, 20)]
    print(f"{'op':>24} {'2^14 slots':>11} {'2^20 slots':>11} {'ratio':>7}")
    for key in (k for k in arows[0] if k != "log2_slots"):
        lo, hi = arows[0][key], arows[1][key]
        print(f"{key:>24} {lo:>11.2f} {hi:>11.2f} {hi / lo:>7.2f}")


def _print_writes(rows: list[dict]) -> None:
    print(
        f"(a) 64-token KV write, bf16 as uint16, {LAYERS} layers x {KV_HEADS} kv head x {HEAD_DIM} dims, "
        f"page_size {PAGE_SIZE}; median ms per call"
    )
    cols = ("donated_layer_ms", "donated_all_ms", "copy_layer_ms", "copy_all_ms")
    print(f"{'pool tokens':>12} {'pool MiB':>9} {'donated 1 layer':>16} {'donated all':>12} ", end="")
    print(f"{'copy 1 layer':>13} {'copy all':>10}")
    for r in rows:
        d1, da, c1, ca = (r[c] for c in cols)
        mib = r["pool_bytes"] / 2**20
        print(f"{2 ** r['log2_tokens']:>12} {mib:>9.0f} {d1:>16.3f} {da:>12.3f} {c1:>13.1f} {ca:>10.1f}")
    small, large = rows
    ratio = {c: large[c] / small[c] for c in cols}
    print(
        f"ratio large/small (pool x{large['pool_bytes'] / small['pool_bytes']:.0f}): "
        f"donated 1 layer {ratio['donated_layer_ms']:.2f}, donated all {ratio['donated_all_ms']:.2f} "
        f"(acceptance <= 1.25); copy 1 layer {ratio['copy_layer_ms']:.1f}, "
        f"copy all {ratio['copy_all_ms']:.1f}"
    )


def _print_memory(rows: list[dict]) -> None:
    print("\n(b) peak resident memory of a fresh process (VmHWM), after steady donated writes")
    print(
        f"{'pool tokens':>12} {'pool MiB':>9} {'baseline MiB':>13} {'peak MiB':>9} {'peak/pool':>10} ", end=""
    )
    print(f"{'(peak-base)/pool':>17} {'peak after copies MiB':>22}")
    for r in rows:
        pool_mib, base, peak = r["pool_bytes"] / 2**20, r["baseline_kib"] / 1024, r["peak_kib_donated"] / 1024
        after = r["peak_kib_after_copies"] / 1024
        print(f"{2 ** r['log2_tokens']:>12} {pool_mib:>9.0f} {base:>13.0f} {peak:>9.0f} ", end="")
        print(f"{peak / pool_mib:>10.2f} {(peak - base) / pool_mib:>17.2f} {after:>22.0f}")


if __name__ == "__main__":
    main()
