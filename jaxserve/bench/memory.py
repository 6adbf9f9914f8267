"""KV-memory benchmark: donated pool writes, peak memory, allocator op costs.

    python -m jaxserve.bench.memory           # 2^14 and 2^18 tokens x 32 layers (2 GiB + a 2 GiB copy)
    python -m jaxserve.bench.memory --small   # 2^12 and 2^16 tokens

(a) Time of one 64-token KV write (bf16 K/V, uint16 storage), per layer (`write_kv_donated`) and for all
    layers at once (`write_kv_all_layers_donated`), donated vs not donated, for a small and a 16x larger pool.
    Both pools live in one process and are sampled alternately (samples of 200 calls), so load from other
    processes hits both alike. Slots: 64 random slots (decode-like), or 4 random whole pages (prefill-like).
    Heads are small so the large pool fits beside other work: 1 KV head x 64 dims (K+V = 256 B per token per
    layer; 2^18 tokens x 32 layers = 2 GiB). The non-donated writes must copy the pool on every call.
(b) Peak resident memory (VmHWM) of a fresh process per pool size, measured after 200 donated writes and
    before any non-donated call, against the pool's bytes and against the process's baseline RSS (after
    importing JAX and running the same writes on a tiny pool).
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


class PoolWriter:
    """One pool plus pre-built device inputs; each method makes one synchronous write call."""

    def __init__(self, log2_tokens: int, seed: int = 0) -> None:
        import jax
        import jax.numpy as jnp

        from jaxserve.memory import kv_pool, make_kv_pool, write_kv_all_layers_donated, write_kv_donated

        self.log2_tokens = log2_tokens
        num_pages = 2**log2_tokens // PAGE_SIZE - 1  # (num_pages + 1) * page_size == 2^log2 slots
        self.pool = make_kv_pool(LAYERS, num_pages, PAGE_SIZE, KV_HEADS, HEAD_DIM, jnp.bfloat16)
        rng = np.random.default_rng(seed)
        real = np.arange(PAGE_SIZE, self.pool.num_slots)  # everything but the padding page
        self.slot_sets = {  # decode-like: 64 random slots; prefill-like: 4 random whole pages
            "random": [rng.choice(real, WRITE_TOKENS, replace=False) for _ in range(8)],
            "pages": [
                (rng.choice(num_pages, WRITE_TOKENS // PAGE_SIZE, replace=False)[:, None] + 1) * PAGE_SIZE
                + np.arange(PAGE_SIZE)
                for _ in range(8)
            ],
        }
        self.slot_sets = {
            k: [jax.device_put(s.reshape(-1).astype(np.int32)) for s in v] for k, v in self.slot_sets.items()
        }
        bf16 = jnp.bfloat16
        self.k = jax.device_put(rng.normal(size=(WRITE_TOKENS, KV_HEADS, HEAD_DIM)).astype(bf16))
        self.k_all = jax.device_put(rng.normal(size=(LAYERS, WRITE_TOKENS, KV_HEADS, HEAD_DIM)).astype(bf16))
        self.layer = jax.device_put(np.int32(3))
        self._donated = (write_kv_donated, write_kv_all_layers_donated)
        self._copying = (jax.jit(kv_pool.write_kv), jax.jit(kv_pool.write_kv_all_layers))
        self._i = 0

    def donated(self, all_layers: bool, pattern: str = "random") -> None:
        self._i += 1
        slots = self.slot_sets[pattern][self._i % 8]
        if all_layers:
            self.pool = self._donated[1](self.pool, slots, self.k_all, self.k_all)
        else:
            self.pool = self._donated[0](self.pool, self.layer, slots, self.k, self.k)
        self.pool.data.block_until_ready()

    def copied(self, all_layers: bool) -> None:
        slots = self.slot_sets["random"][0]
        if all_layers:
            out = self._copying[1](self.pool, slots, self.k_all, self.k_all)
        else:
            out = self._copying[0](self.pool, self.layer, slots, self.k, self.k)
        out.data.block_until_ready()


def memory_child(log2_tokens: int, copy_reps: int) -> dict:
    """In a fresh process: peak RSS after steady donated writes, then after non-donated ones."""
    warm = PoolWriter(8)  # imports jax, starts the runtime, compiles the tiny-pool programs
    warm.donated(all_layers=True)
    del warm
    baseline_kib = _vm_kib("VmRSS")
    writer = PoolWriter(log2_tokens)
    for _ in range(200):
        writer.donated(all_layers=bool(_ % 2))
    out = {"log2_tokens": log2_tokens, "pool_bytes": writer.pool.nbytes, "baseline_kib": baseline_kib}
    out["peak_kib_donated"] = _vm_kib("VmHWM")
    for _ in range(copy_reps):
        writer.copied(all_layers=True)
    out["peak_kib_after_copies"] = _vm_kib("VmHWM")
    return out


def interleaved_write_times(log2_sizes: tuple[int, int], samples: int, copy_reps: int) -> dict:
    """Median ms per call for each pool, sampling the two pools alternately so load noise hits both alike."""
    writers = [PoolWriter(n) for n in log2_sizes]
    cases = {
        "donated 1 layer": lambda w: w.donated(False),
        "donated all layers": lambda w: w.donated(True),
        "donated all, 4 whole pages": lambda w: w.donated(True, "pages"),
        "copy 1 layer": lambda w: w.copied(False),
        "copy all layers": lambda w: w.copied(True),
    }
    result = {}
    for name, fn in cases.items():
        copying = name.startswith("copy")
        calls, reps = (1, copy_reps) if copying else (200, samples)
        for w in writers:
            fn(w)  # compile / warm up
        times: list[list[float]] = [[], []]
        for _ in range(reps):
            for i, w in enumerate(writers):
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn(w)
                times[i].append((time.perf_counter() - t0) * 1e3 / calls)
        result[name] = [float(np.median(t)) for t in times]
    return result


class AllocWorkload:
    """Alloc 64 + free 64 at ~50% occupancy (frees in random order); `batch(n)` returns us per pair."""

    def __init__(self, state, alloc, free, rng) -> None:
        self.alloc, self.free = alloc, free
        live = []
        while len(live) * WRITE_TOKENS * 2 < getattr(state, "full", state).num_slots:  # fill to half
            state, slots = alloc(state, WRITE_TOKENS)
            live.append(slots)
        self.state, self.live = state, deque(live[i] for i in rng.permutation(len(live)))

    def batch(self, ops: int) -> float:
        state, live, alloc, free = self.state, self.live, self.alloc, self.free
        t0 = time.perf_counter()
        for _ in range(ops):
            state = free(state, live.popleft())
            state, slots = alloc(state, WRITE_TOKENS)
            live.append(slots)
        self.state = state
        return (time.perf_counter() - t0) * 1e6 / ops


class FacadeWorkload:
    """Backup / restore / the speculative backup + alloc 64 + restore on a half-full token allocator."""

    def __init__(self, num_slots: int, kind: str) -> None:
        from jaxserve.memory import AllocatorFacade, make_allocator

        self.facade, self.kind = AllocatorFacade(make_allocator(num_slots, 1)), kind
        for _ in range(num_slots // (2 * WRITE_TOKENS)):
            self.facade.alloc(WRITE_TOKENS)

    def batch(self, ops: int) -> float:
        facade, saved = self.facade, self.facade.state
        t0 = time.perf_counter()
        if self.kind == "backup":
            for _ in range(ops):
                saved = facade.state
        elif self.kind == "restore":
            for _ in range(ops):
                facade.state = saved
        else:
            for _ in range(ops):
                saved = facade.state
                facade.alloc(WRITE_TOKENS)
                facade.state = saved
        return (time.perf_counter() - t0) * 1e6 / ops


def allocator_table(log2_sizes: tuple[int, int], ops: int, batches: int) -> dict[str, list[float]]:
    """Median us per op for each case and size, batches of the two sizes alternating."""
    from jaxserve.memory import allocator, make_allocator, make_swa_allocator, swa_allocator

    rng = np.random.default_rng(1)
    makers = {
        "token alloc+free": lambda n: AllocWorkload(
            make_allocator(n, 1), allocator.alloc, allocator.free, rng
        ),
        "paged(16) alloc+free": lambda n: AllocWorkload(
            make_allocator(n // 16, 16), allocator.alloc, allocator.free, rng
        ),
        "swa alloc+free": lambda n: AllocWorkload(
            make_swa_allocator(n, n // 2, 1), swa_allocator.alloc, swa_allocator.free, rng
        ),
        "backup": lambda n: FacadeWorkload(n, "backup"),
        "restore": lambda n: FacadeWorkload(n, "restore"),
        "backup+alloc64+restore": lambda n: FacadeWorkload(n, "speculative"),
    }
    table = {}
    for name, make in makers.items():
        workloads = [make(2**n) for n in log2_sizes]
        per_op = 20 * ops if name in ("backup", "restore") else ops
        times: list[list[float]] = [[], []]
        for _ in range(batches):
            for i, w in enumerate(workloads):
                times[i].append(w.batch(per_op))
        table[name] = [float(np.median(t)) for t in times]
    return table


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
    parser.add_argument("--copy-reps", type=int, default=3, help="repetitions of the non-donated writes")
    parser.add_argument("--samples", type=int, default=40, help="timing samples (of 200 calls) per pool")
    parser.add_argument("--alloc-ops", type=int, default=300, help="alloc+free pairs per timing batch")
    args = parser.parse_args(argv)
    if args.child_write is not None:
        print(json.dumps(memory_child(args.child_write, args.copy_reps)))
        return
    sizes = (12, 16) if args.small else (14, 18)
    _print_writes(sizes, interleaved_write_times(sizes, args.samples, args.copy_reps))
    _print_memory([_run_child(log2, args.copy_reps) for log2 in sizes])
    print("\n(c) allocator microseconds per op, 50% occupancy, batches of the two sizes alternating")
    table = allocator_table((14, 20), args.alloc_ops, 15)
    print(f"{'op':>24} {'2^14 slots':>11} {'2^20 slots':>11} {'ratio':>7}")
    for key, (lo, hi) in table.items():
        print(f"{key:>24} {lo:>11.2f} {hi:>11.2f} {hi / lo:>7.2f}")
    print("acceptance: per-op ratio <= 1.5; backup/restore O(1)")


def _print_writes(sizes: tuple[int, int], times: dict) -> None:
    pool_mib = [2**n * LAYERS * 2 * KV_HEADS * HEAD_DIM * 2 / 2**20 for n in sizes]
    print(
        f"(a) 64-token KV write, bf16 as uint16, {LAYERS} layers x {KV_HEADS} kv head x {HEAD_DIM} dims, "
        f"page_size {PAGE_SIZE}; median ms per call, both pools sampled alternately in one process"
    )
    print(f"{'case':>28} {f'2^{sizes[0]} ({pool_mib[0]:.0f} MiB)':>18} ", end="")
    print(f"{f'2^{sizes[1]} ({pool_mib[1]:.0f} MiB)':>18} {'ratio':>7}")
    for name, (lo, hi) in times.items():
        print(f"{name:>28} {lo:>18.3f} {hi:>18.3f} {hi / lo:>7.2f}")
    print(
        "acceptance: donated ratio <= 1.25 for a 16x larger pool; the copy rows show the O(pool) alternative"
    )


def _print_memory(rows: list[dict]) -> None:
    print("\n(b) peak resident memory of a fresh process per pool (VmHWM), after 200 donated writes")
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
