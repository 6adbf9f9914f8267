"""One command for an accelerator machine: the Pallas kernel against `native` and `xla`, then its speed.

    python -m jaxserve.bench.device                 # on a TPU or GPU: correctness table, then timing table
    python -m jaxserve.bench.device --budget-s 300  # stop timing rows once 300 s have passed

On a TPU it checks `pallas_tpu`, on a GPU `pallas_gpu`; on a CPU it says there is no accelerator and runs
the correctness cases at small sizes with both kernels in Pallas interpret mode (about a minute).

Correctness: ragged steps of served-model shapes (gpt-oss: 64 query / 8 KV heads of 64, window 128 and
sinks; Llama: 32 / 8 of 128; head_dim 256), prefill chunks after cached prefixes, decodes at long
contexts, an EAGLE tree under a custom mask, bf16, fp8 and f32 pools; each backend's output against
`native` (max |difference| and the tolerance of the pool's dtype).

Timing: one attention call per row (the step's K/V write and the kernel, pool donated and threaded
through the calls), decode at batch 1/8/64 x contexts 1k/4k/16k and mixed steps (one 1,024-token prefill
chunk plus decodes), the median of `--repeats` calls after a compiling one. `GB/s` is the KV bytes the
step must read (every sequence's context once, all KV heads) over the time; `of copy` is that over the
device's copy bandwidth measured in the same run (a large `jnp` array copied, read + write bytes);
`x native` is native's time over the backend's. A row a backend cannot run prints its error's class.
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
TOLERANCE = {"bfloat16": 3e-2, "float8_e4m3fn": 1e-2, "float32": 1e-4}


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


# ---- correctness -----------------------------------------------------------------------------------------
def correctness_cases(small: bool) -> list[tuple[Layout, list[Seq]]]:
    """Served-model layouts; `small` shrinks contexts and heads for interpret mode on a CPU."""
    gpt_oss = Layout("gpt-oss (sliding)", 64, 8, 64, window=128, sinks=True)
    llama = Layout("llama-3-8b", 32, 8, 128, page_size=64)
    wide = Layout("head_dim 256, f32", 8, 4, 256, pool_dtype="float32", page_size=16, window=1024)
    fp8 = Layout("gpt-oss (full), fp8 pool", 64, 8, 64, pool_dtype="float8_e4m3fn", sinks=True)
    mixed = [Seq(1000, 200), Seq(3000, 1), Seq(17, 1), Seq(4000, 1), Seq(2000, 8, tree=True), Seq(0, 64)]
    if small:
        shrink = lambda lay: dataclasses.replace(lay, q_heads=lay.q_heads // 8 * 2 or 2,
                                                 kv_heads=max(1, lay.kv_heads // 4), page_size=16,
                                                 window=lay.window and 24)
        gpt_oss, llama, wide, fp8 = map(shrink, (gpt_oss, llama, wide, fp8))
        mixed = [Seq(40, 12), Seq(90, 1), Seq(3, 1), Seq(30, 6, tree=True), Seq(0, 9)]
    return [(gpt_oss, mixed), (llama, mixed), (wide, mixed), (fp8, mixed)]


def check(names: list[str], small: bool, interpret: bool) -> bool:
    """Print one line per (case, backend): max |out - native| and pass/fail; True when all pass."""
    print(f"{'case':<28} {'backend':<11} {'max |diff|':>11} {'tol':>7}  result")
    ok = True
    for layout, seqs in correctness_cases(small):
        pool, meta, q, k, v = build_step(layout, seqs)
        sinks = jnp.asarray(np.random.RandomState(1).randn(layout.q_heads), jnp.float32)
        want, _ = attention_fn("native", layout)(q, k, v, copy_pool(pool), meta, sinks)
        want = np.asarray(want, np.float32)
        for name in names:
            options = {"interpret": True} if interpret and name.startswith("pallas") else {}
            try:
                got, _ = attention_fn(name, layout, **options)(q, k, v, copy_pool(pool), meta, sinks)
                diff = float(np.abs(np.asarray(got, np.float32) - want).max())
                tol = TOLERANCE[layout.pool_dtype]
                result = "ok" if diff <= tol else "MISMATCH"
            except Exception as exc:  # a backend that fails here is reported, then the others still run
                diff, tol, result = float("nan"), TOLERANCE[layout.pool_dtype], f"FAILED {type(exc).__name__}"
            ok &= result == "ok"
            print(f"{layout.name:<28} {name:<11} {diff:>11.2e} {tol:>7.0e}  {result}", flush=True)
    return ok


# ---- timing ----------------------------------------------------------------------------------------------
def copy_bandwidth(num_bytes: int = 1 << 30) -> float:
    """Bytes/s of a device-side copy of a `num_bytes` array (read + write counted)."""
    x = jnp.zeros(num_bytes // 4, jnp.float32)
    f = jax.jit(lambda a: a + 1.0)
    f(x).block_until_ready()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        f(x).block_until_ready()
        times.append(time.perf_counter() - start)
    return 2 * num_bytes / min(times)


def timing_rows() -> list[tuple[str, list[Seq]]]:
    rows = []
    for context in (1024, 4096, 16384):
        for batch in (1, 8, 64):
            rows.append((f"decode {batch}x{context // 1024}k", [Seq(context - 1, 1)] * batch))
    for context in (4096, 16384):
        for batch in (8, 64):
            chunk, decodes = Seq(context - 1024, 1024), [Seq(context - 1, 1)] * (batch - 1)
            rows.append((f"mixed 1k chunk + {batch - 1}x{context // 1024}k", [chunk, *decodes]))
    return rows


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


def bench(names: list[str], layout: Layout, repeats: int, budget_s: float) -> None:
    bandwidth = copy_bandwidth()
    print(f"\ncopy bandwidth: {bandwidth / 1e9:.0f} GB/s; layout {layout}")
    print(f"{'row':<26} {'backend':<11} {'ms':>9} {'GB/s':>7} {'of copy':>8} {'x native':>9}")
    started = time.perf_counter()
    for label, seqs in timing_rows():
        if time.perf_counter() - started > budget_s:
            print(f"{label:<26} skipped: --budget-s {budget_s:.0f} reached")
            continue
        try:
            pool, meta, q, k, v = build_step(layout, seqs)
        except Exception as exc:  # the row's pool does not fit this device
            print(f"{label:<26} skipped: {type(exc).__name__} building the pool")
            continue
        sinks = jnp.zeros(layout.q_heads, jnp.float32)
        kv_bytes = sum(s.cached + s.new for s in seqs) * layout.kv_heads * 2 * layout.head_dim * (
            np.dtype(pool.storage_dtype).itemsize)
        times = {}
        for name in ["native", *names]:  # native first: the others' rows give their speed-up over it
            try:
                times[name] = time_call(attention_fn(name, layout), q, k, v, copy_pool(pool), meta, sinks,
                                        repeats)
            except Exception as exc:  # e.g. native's gathered keys do not fit: the row says so
                print(f"{label:<26} {name:<11} failed: {type(exc).__name__}")
                continue
            speedup = times["native"] / times[name] if "native" in times else float("nan")
            print(f"{label:<26} {name:<11} {times[name] * 1e3:>9.3f} {kv_bytes / times[name] / 1e9:>7.1f} "
                  f"{kv_bytes / times[name] / bandwidth:>8.2f} {speedup:>9.2f}", flush=True)
        del pool


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--budget-s", type=float, default=360.0, help="stop starting timing rows after this")
    args = parser.parse_args(argv)
    platform = jax.default_backend()
    kernel = KERNEL_BY_PLATFORM.get(platform)
    print(f"jax {jax.__version__}, platform {platform}, devices {jax.devices()}")
    if kernel is None:
        print("no accelerator: interpret-mode correctness check of both kernels at small sizes")
        ok = check(["pallas_tpu", "pallas_gpu", "xla"], small=True, interpret=True)
        print("correctness:", "all ok" if ok else "FAILURES above")
        return
    ok = check([kernel, "xla"], small=False, interpret=False)
    print("correctness:", "all ok" if ok else "FAILURES above")
    page_size = 64 if platform == "tpu" else 16
    bench([kernel, "xla"], Layout("llama-3-8b", 32, 8, 128, page_size=page_size), args.repeats, args.budget_s)


if __name__ == "__main__":
    main()
