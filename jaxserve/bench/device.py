"""One command for an accelerator machine: the Pallas kernel against `native` and `xla`, then its speed.

    python -m jaxserve.bench.device                 # on a TPU or GPU: correctness table, then timing table
    python -m jaxserve.bench.device --budget-s 300  # stop timing rows once 300 s have passed

On a TPU it checks `pallas_tpu`, on a GPU `pallas_gpu`; on a CPU it says there is no accelerator and runs
the correctness cases at small sizes with both kernels in Pallas interpret mode (about a minute).

Correctness: ragged steps of served-model shapes (gpt-oss: 64 query / 8 KV heads of 64, window 128 and
sinks; Llama: 32 / 8 of 128; head_dim 256), prefill chunks after cached prefixes, decodes at long
contexts, an EAGLE tree under a custom mask, bf16, fp8 and f32 pools; each backend's output against
`native` (max |difference| and the tolerance of the pool's dtype).

Timing: `jaxserve.bench.attention`'s table (native, xla and the kernel; its docstring says what each
column means), within `--budget-s`.
"""

from __future__ import annotations

import argparse
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.bench.attention import (
    KERNEL_BY_PLATFORM,
    Layout,
    Seq,
    attention_fn,
    bench,
    build_step,
    copy_pool,
    llama_layout,
)

TOLERANCE = {"bfloat16": 3e-2, "float8_e4m3fn": 1e-2, "float32": 1e-4}


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
    print()
    bench(["native", "xla", kernel], llama_layout(platform), repeats=args.repeats, budget_s=args.budget_s)


if __name__ == "__main__":
    main()
