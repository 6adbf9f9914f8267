"""One command for an accelerator machine: the engine's serving targets, or the Pallas kernel's checks.

    python -m jaxserve.bench.device                     # serving targets (`serving_lines`), one table
    python -m jaxserve.bench.device --stages kernels    # the kernel: three stages, one summary table
    python -m jaxserve.bench.device --budget-s 200      # the kernels' attention table's budget (240 s)
    python -m jaxserve.bench.device --serving-budget-s 300  # no serving stage starts past it (360 s)
    python -m jaxserve.bench.device --tiny              # every stage at tiny sizes (on a CPU: interpret mode)

Each of `--stages kernels` and `--stages serving` is meant to fit one 10-minute command on an H100 or H200
from a cold start (compiles included); `--stages kernels serving` runs both, in that order.

Serving (`jaxserve.bench.serving_lines`): EAGLE-3 against plain decoding at batches 1 to 64, host time
per EAGLE-3 round against its device time (on a served model's shapes and on the embedded model), the
grammar mask's cost at batch 8, host time per decode step against context length; one line per target,
`met` or `NOT met`.

Kernels. On a TPU it checks `pallas_tpu`, on a GPU `pallas_gpu`; on a CPU without `--tiny` it says there is no
accelerator and runs the correctness cases at small sizes with both kernels in Pallas interpret mode.

Correctness: ragged steps of served-model shapes (gpt-oss: 64 query / 8 KV heads of 64, window 128 and
sinks; Llama: 32 / 8 of 128; head_dim 256), prefill chunks after cached prefixes, decodes at long
contexts, an EAGLE tree under a custom mask, bf16, fp8 and f32 pools; each backend's output against
`native` (max |difference| and the tolerance of the pool's dtype).

Timing: `jaxserve.bench.attention`'s table (native, xla and the kernel; its docstring says what each
column means), within `--budget-s`, against the copy bandwidth measured here.

End-to-end: `jaxserve.bench.gpt_oss_e2e` (a random-weight gpt-oss-20b-shaped model of `--layers` layers
with a random EAGLE-3 head, greedy decode on native then on the kernel: tokens equal, tokens/s).

Summary: one table of the three stages and the run's total seconds (meant to fit 8 minutes on an H200).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.bench import gpt_oss_e2e, serving_lines
from jaxserve.bench.attention import (
    FULL,
    KERNEL_BY_PLATFORM,
    QUICK,
    Layout,
    Seq,
    Sizes,
    attention_fn,
    bench,
    build_step,
    copy_bandwidth,
    copy_pool,
    kv_bytes,
    llama_layout,
    timing_rows,
)

TOLERANCE = {"bfloat16": 3e-2, "float8_e4m3fn": 1e-2, "float32": 1e-4}
TINY_LAYOUT = Layout("tiny", 4, 2, 16)  # --tiny's attention table: interpret-mode kernels stay quick


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


def summary(correct: bool, timings: dict[tuple[str, str], float], layout: Layout, sizes: Sizes,
            bandwidth: float, kernels: list[str], e2e: list, seconds: float) -> None:
    """The run's summary table: correctness, the kernel's share of the copy bandwidth on the largest-batch
    4k decode row (the acceptance row; else the largest decode row it timed), end-to-end tokens/s."""
    print(f"\n{'stage':<12} {'backend':<11} result")
    print(f"{'correctness':<12} {'all':<11} {'all ok' if correct else 'FAILURES (see above)'}")
    decode = {label: seqs for label, seqs in timing_rows(sizes) if label.startswith("decode")}
    for name in kernels:
        timed = [label for label in decode if (label, name) in timings]
        if not timed:
            print(f"{'attention':<12} {name:<11} no decode row timed")
            continue
        label = f"decode {max(sizes.batches)}x4k" if f"decode {max(sizes.batches)}x4k" in timed else timed[-1]
        share = kv_bytes(layout, decode[label]) / timings[label, name] / bandwidth
        native = timings.get((label, "native"))
        versus = f", {native / timings[label, name]:.2f}x native" if native else ""
        print(f"{'attention':<12} {name:<11} {label}: {share:.2f} of copy bandwidth{versus}")
    native = e2e[0][0]
    for result, agree in e2e[1:]:
        print(f"{'end-to-end':<12} {result.backend:<11} {result.tokens_per_s:.1f} tokens/s, "
              f"{result.tokens_per_s / native.tokens_per_s:.2f}x native, tokens {agree}")
    print(f"{'total':<12} {'':<11} {seconds:.0f} s")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--budget-s", type=float, default=240.0, help="the attention table's time budget")
    parser.add_argument("--layers", type=int, default=4, help="layers of the end-to-end model")
    parser.add_argument("--tiny", action="store_true",
                        help="every stage at tiny sizes (on a CPU: the kernels in interpret mode)")
    parser.add_argument("--kernels", nargs="+", default=None,
                        help="default: the platform's kernel (on a CPU both)")
    parser.add_argument("--e2e-backends", nargs="+", default=None,
                        help="the end-to-end stage's backends besides native (default: --kernels)")
    parser.add_argument("--stages", nargs="+", choices=("kernels", "serving"), default=["serving"])
    parser.add_argument("--serving-budget-s", type=float, default=360.0,
                        help="no serving stage starts after this many seconds of the serving run")
    parser.add_argument("--served-layers", type=int, default=12,
                        help="layers of the gpt-oss-20b-shaped model the serving stage times rounds on")
    args = parser.parse_args(argv)
    print(f"jax {jax.__version__}, platform {jax.default_backend()}, devices {jax.devices()}")
    if "kernels" in args.stages:
        kernel_stages(args)
    if "serving" in args.stages and jax.default_backend() == "cpu" and not args.tiny:
        print("no accelerator: the serving targets are judged on a TPU or GPU (--tiny runs every serving "
              "stage at tiny sizes; each `jaxserve.bench` module runs on a CPU at its own sizes)")
    elif "serving" in args.stages:
        started = time.perf_counter()
        options = serving_lines.Options(tiny=args.tiny, served_layers=args.served_layers)
        lines = serving_lines.run(options, budget_s=args.serving_budget_s)
        print(f"\n{serving_lines.summary(lines)}")
        print(f"serving total {time.perf_counter() - started:.0f} s")


def kernel_stages(args: argparse.Namespace) -> None:
    """Kernel correctness, the attention timing table and the end-to-end decode (see the module docstring)."""
    started = time.perf_counter()
    platform = jax.default_backend()
    kernel = KERNEL_BY_PLATFORM.get(platform)
    kernels = args.kernels or ([kernel] if kernel else ["pallas_tpu", "pallas_gpu"])
    interpret = kernel is None
    if interpret and not args.tiny:
        print("no accelerator: interpret-mode correctness check of both kernels at small sizes "
              "(--tiny runs every stage)")
        ok = check([*kernels, "xla"], small=True, interpret=True)
        print("correctness:", "all ok" if ok else "FAILURES above")
        return
    ok = check([*kernels, "xla"], small=args.tiny, interpret=interpret)
    print("correctness:", "all ok" if ok else "FAILURES above")
    print()
    layout, sizes = (TINY_LAYOUT, QUICK) if args.tiny else (llama_layout(platform), FULL)
    bandwidth = copy_bandwidth(1 << 26 if args.tiny else 1 << 30)
    timings = bench(["native", "xla", *kernels], layout, sizes=sizes, repeats=args.repeats,
                    budget_s=args.budget_s, bandwidth=bandwidth, interpret=interpret)
    print()
    e2e = gpt_oss_e2e.bench(args.e2e_backends or kernels, num_layers=args.layers, tiny=args.tiny,
                            **(gpt_oss_e2e.TINY_SIZES if args.tiny else {}))
    summary(ok, timings, layout, sizes, bandwidth, kernels, e2e, time.perf_counter() - started)


if __name__ == "__main__":
    main()
