"""Attention benchmark: one paged-attention call per backend on ragged decode and mixed steps, in one run.

    python -m jaxserve.bench.attention                  # every backend this platform runs, full sizes
    python -m jaxserve.bench.attention --quick          # small sizes (seconds on a CPU)
    python -m jaxserve.bench.attention --backends native xla --budget-s 120

Backends (default): `native`, `xla` and the platform's Pallas kernel (`pallas_tpu` on a TPU, `pallas_gpu` on
a GPU). A CPU runs the kernels only in Pallas interpret mode, a correctness tool whose speed means nothing:
`--interpret` adds both there.

Rows: decode steps (every sequence one new token) and mixed steps (one prefill chunk of 1,024 tokens ending
at the context, plus batch - 1 decodes), batch 1/8/64 x contexts 1k/4k/16k (`--quick`: batch 1/4 x context
256, chunk 32). Layout: Llama-3-8B attention (32 query / 8 KV heads of 128, bf16 pool), page size 64 on a
TPU, 16 elsewhere. A call is what a model layer runs: the step's K/V written into the donated pool, then
attention; the pool is threaded through the calls.

Columns: `ms`, the median of `--repeats` calls after a compiling one; `GB/s`, the KV bytes the step must
read (every sequence's context once, all KV heads, K and V) over that time; `of copy`, that over the
device's copy bandwidth measured in the same run (a large `jnp` array copied, read + write bytes);
`x native`, native's time over the backend's in the same row.

Skips, each printed with its reason and listed again at the end: rows whose pool exceeds `--max-kv-gb`;
backends whose time on a row, predicted from their seconds per KV byte on their last row of the same kind
(decode or mixed), would not fit the time left of `--budget-s`; every row once the budget is spent. A
backend that fails prints its error.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.layers.attention_metadata import SequenceStep, build_attention_metadata
from jaxserve.layers.backends import get_backend
from jaxserve.memory.kv_pool import KVPool, make_kv_pool

KERNEL_BY_PLATFORM = {"tpu": "pallas_tpu", "gpu": "pallas_gpu", "cuda": "pallas_gpu", "rocm": "pallas_gpu"}
COLUMNS = ["row", "backend", "ms", "GB/s", "of copy", "x native"]


@dataclasses.dataclass(frozen=True)
class Layout:
    """Attention shape of one layer: heads, head_dim, pool dtype, page size, window and sinks."""

    name: str
    q_heads: int
    kv_heads: int
    head_dim: int
    pool_dtype: str = "bfloat16"
    page_size: int = 16
    window: int | None = None
    sinks: bool = False

    @property
    def compute(self):
        return jnp.bfloat16 if self.pool_dtype == "bfloat16" else jnp.float32


@dataclasses.dataclass(frozen=True)
class Seq:
    """One sequence of a step: `cached` keys already in the pool, `new` tokens this step, `tree`: the new
    tokens are EAGLE tree candidates (random parents) under a custom mask."""

    cached: int
    new: int
    tree: bool = False


@dataclasses.dataclass(frozen=True)
class Sizes:
    """The row grid: batch sizes, contexts (tokens, the new ones included) and the mixed rows' chunk."""

    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    chunk: int


FULL = Sizes(batches=(1, 8, 64), contexts=(1024, 4096, 16384), chunk=1024)
QUICK = Sizes(batches=(1, 4), contexts=(256,), chunk=32)


def llama_layout(platform: str) -> Layout:
    """Llama-3-8B's attention layer, with the page size the platform's kernel prefers."""
    return Layout("llama-3-8b", 32, 8, 128, page_size=64 if platform == "tpu" else 16)


def build_step(layout: Layout, seqs: list[Seq], seed: int = 0):
    """(pool of random K/V, metadata, q, k, v) for one ragged step; pages are shuffled across sequences."""
    rng = np.random.RandomState(seed)
    ps = layout.page_size
    pages_of = [-(-(s.cached + s.new) // ps) for s in seqs]
    order = rng.permutation(sum(pages_of)) + 1
    pool = make_kv_pool(1, sum(pages_of), ps, layout.kv_heads, layout.head_dim, layout.pool_dtype,
                        fp8_scale=0.05)
    values = jax.random.normal(jax.random.PRNGKey(seed), pool.data.shape, jnp.float32)
    if layout.pool_dtype == "bfloat16":
        bits = jax.lax.bitcast_convert_type(values.astype(jnp.bfloat16), jnp.uint16)
    elif layout.pool_dtype == "float8_e4m3fn":
        bits = jax.lax.bitcast_convert_type((values * 4).astype(jnp.float8_e4m3fn), jnp.uint8)
    else:
        bits = values
    pool = pool.replace(data=bits)
    steps, mask_rows, offset = [], [], 0
    max_keys = max(pages_of) * ps
    for s, num_pages in zip(seqs, pages_of, strict=True):
        own = order[offset: offset + num_pages]
        offset += num_pages
        rows = np.arange(max_keys)[None, :] <= np.arange(s.cached, s.cached + s.new)[:, None]
        positions = None
        if s.tree:
            parents = [-1] + [int(rng.randint(0, c)) for c in range(1, s.new)]
            rows = np.zeros((s.new, max_keys), bool)
            rows[:, : s.cached] = True
            depth = np.zeros(s.new, np.int32)
            for c in range(s.new):
                node = c
                while node >= 0:
                    rows[c, s.cached + node] = True
                    depth[c] += node != c
                    node = parents[node]
            positions = s.cached + depth
        mask_rows.append(rows)
        steps.append(SequenceStep(s.new, s.cached + s.new, own, positions=positions))
    has_tree = any(s.tree for s in seqs)
    meta = build_attention_metadata(steps, page_size=ps, custom_mask=np.concatenate(mask_rows) if has_tree
                                    else None)
    q, k, v = (jnp.asarray(rng.randn(meta.num_tokens, h, layout.head_dim), layout.compute)
               for h in (layout.q_heads, layout.kv_heads, layout.kv_heads))
    return pool, jax.tree.map(jnp.asarray, meta), q, k, v


def attention_fn(name: str, layout: Layout, **options) -> Callable:
    """jit of one backend call on `(q, k, v, pool, meta, sinks)`, the pool donated."""

    def call(q, k, v, pool, meta, sinks):
        return get_backend(name)(q, k, v, pool, 0, meta, sliding_window=layout.window,
                                 sinks=sinks if layout.sinks else None, **options)

    return jax.jit(call, donate_argnums=3)


def copy_pool(pool: KVPool) -> KVPool:
    return pool.replace(data=jnp.copy(pool.data))


def copy_bandwidth(num_bytes: int = 1 << 30) -> float:
    """Bytes/s of a device-side copy of a `num_bytes` array (read + write counted), best of 5."""
    x = jnp.zeros(num_bytes // 4, jnp.float32)
    f = jax.jit(lambda a: a + 1.0)
    f(x).block_until_ready()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        f(x).block_until_ready()
        times.append(time.perf_counter() - start)
    return 2 * num_bytes / min(times)


def timing_rows(sizes: Sizes = FULL) -> list[tuple[str, list[Seq]]]:
    """(label, step) per row, smallest contexts first: `decode BxC` is B decodes at context C; `mixed BxC`
    one chunk of `sizes.chunk` tokens (capped at C) ending at context C plus B - 1 decodes."""
    rows = []
    for context in sizes.contexts:
        size = f"{context // 1024}k" if context % 1024 == 0 else str(context)
        chunk = min(sizes.chunk, context)
        for batch in sizes.batches:
            rows.append((f"decode {batch}x{size}", [Seq(context - 1, 1)] * batch))
        for batch in sizes.batches:
            decodes = [Seq(context - 1, 1)] * (batch - 1)
            rows.append((f"mixed {batch}x{size}", [Seq(context - chunk, chunk), *decodes]))
    return rows


def kv_bytes(layout: Layout, seqs: list[Seq]) -> int:
    """Bytes of K and V a step must read: every sequence's context once, all KV heads."""
    itemsize = {"bfloat16": 2, "float8_e4m3fn": 1, "float32": 4}[layout.pool_dtype]
    return sum(s.cached + s.new for s in seqs) * layout.kv_heads * 2 * layout.head_dim * itemsize


def time_call(fn: Callable, q, k, v, pool, meta, sinks, repeats: int) -> float:
    """Median seconds of `repeats` calls after a compiling one, the donated pool threaded through."""
    out, pool = fn(q, k, v, pool, meta, sinks)
    out.block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out, pool = fn(q, k, v, pool, meta, sinks)
        out.block_until_ready()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _line(*cells) -> str:
    return f"{cells[0]:<16} {cells[1]:<11} " + " ".join(f"{c:>9}" for c in cells[2:])


def bench(names: list[str], layout: Layout, *, sizes: Sizes = FULL, repeats: int = 5, budget_s: float = 360.0,
          max_kv_gb: float | None = None, bandwidth: float | None = None, interpret: bool = False,
          ) -> dict[tuple[str, str], float]:
    """Print the table (see the module docstring) and return the seconds per call by (row, backend).
    `native` is timed first in each row when it is in `names`. `bandwidth`: the copy bandwidth in bytes/s
    (None: measured now). `interpret`: the Pallas kernels run in interpret mode."""
    bandwidth = bandwidth or copy_bandwidth()
    print(f"copy bandwidth: {bandwidth / 1e9:.4g} GB/s; layout {layout}")
    print(_line(*COLUMNS))
    names = sorted(names, key=lambda n: n != "native")
    started, skipped = time.perf_counter(), []
    # seconds per KV byte of each (row kind, backend) on its last timed row: native's work follows tokens x
    # context, so a mixed row costs it far more per byte than a decode row, and each kind predicts its own
    per_byte: dict[tuple[str, str], float] = {}
    results: dict[tuple[str, str], float] = {}

    def skip(label: str, name: str, reason: str) -> None:
        skipped.append(f"{label} {name}: {reason}")
        print(_line(label, name, f"skipped: {reason}"), flush=True)

    for label, seqs in timing_rows(sizes):
        row_bytes, kind = kv_bytes(layout, seqs), label.split()[0]
        left = budget_s - (time.perf_counter() - started)
        if left <= 0:
            skip(label, "all", f"--budget-s {budget_s:g} spent")
            continue
        if max_kv_gb is not None and row_bytes > max_kv_gb * 1e9:
            skip(label, "all", f"KV {row_bytes / 1e9:.2f} GB > --max-kv-gb {max_kv_gb:g}")
            continue
        try:
            pool, meta, q, k, v = build_step(layout, seqs)
        except Exception as exc:  # the row's pool does not fit this device
            skip(label, "all", f"{type(exc).__name__} building the pool")
            continue
        sinks = jnp.zeros(layout.q_heads, jnp.float32)
        for name in names:
            left = budget_s - (time.perf_counter() - started)
            predicted = per_byte.get((kind, name), 0.0) * row_bytes * (repeats + 1)
            if predicted > left:
                skip(label, name, f"predicted {predicted:.0f} s > {max(left, 0):.0f} s left of --budget-s")
                continue
            options = {"interpret": True} if interpret and name.startswith("pallas") else {}
            try:
                seconds = time_call(attention_fn(name, layout, **options), q, k, v, copy_pool(pool), meta,
                                    sinks, repeats)
            except Exception as exc:  # e.g. native's gathered keys do not fit: the row says so
                skip(label, name, f"failed: {type(exc).__name__}")
                continue
            results[label, name], per_byte[kind, name] = seconds, seconds / row_bytes
            native = results.get((label, "native"))
            print(_line(label, name, f"{seconds * 1e3:.4g}", f"{row_bytes / seconds / 1e9:.3g}",
                        f"{row_bytes / seconds / bandwidth:.3g}",
                        f"{native / seconds:.2f}" if native else "n/a"), flush=True)
        del pool
    if skipped:
        print(f"skipped ({len(skipped)}): " + "; ".join(skipped))
    return results


def default_backends(platform: str, interpret: bool) -> list[str]:
    """native, xla and the platform's kernel; on a CPU both kernels, in interpret mode, when asked."""
    kernel = KERNEL_BY_PLATFORM.get(platform)
    if kernel:
        return ["native", "xla", kernel]
    return ["native", "xla", *(["pallas_tpu", "pallas_gpu"] if interpret else [])]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", nargs="+", default=None, help="default: those this platform runs")
    parser.add_argument("--quick", action="store_true", help="small sizes (batch 1/4 x context 256)")
    parser.add_argument("--interpret", action="store_true",
                        help="on a CPU, also time the Pallas kernels in interpret mode (slow)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--budget-s", type=float, default=360.0,
                        help="skip what would not finish within this many seconds of timing")
    parser.add_argument("--max-kv-gb", type=float, default=None,
                        help="skip rows whose KV exceeds this (default: 2 on a CPU, no limit elsewhere)")
    args = parser.parse_args(argv)
    platform = jax.default_backend()
    on_cpu = platform not in KERNEL_BY_PLATFORM
    max_kv_gb = args.max_kv_gb if args.max_kv_gb is not None else (2.0 if on_cpu else None)
    print(f"jax {jax.__version__}, platform {platform}, devices {jax.devices()}")
    bench(args.backends or default_backends(platform, args.interpret), llama_layout(platform),
          sizes=QUICK if args.quick else FULL, repeats=args.repeats, budget_s=args.budget_s,
          max_kv_gb=max_kv_gb, bandwidth=copy_bandwidth(1 << 26 if args.quick else 1 << 30),
          interpret=on_cpu)


if __name__ == "__main__":
    main()
