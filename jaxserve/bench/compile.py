"""Compile time of one step bucket against model depth: layers as a `lax.scan` vs the unrolled layer loop.

    python -m jaxserve.bench.compile                        # tiny Llama, 4 and 32 layers
    python -m jaxserve.bench.compile --arch gpt_oss --layers 4 32 --json

For each depth the same tiny model (random weights, float32; `--arch` llama, qwen3 or gpt_oss with
alternating sliding/full layers and MoE) is built once; its jitted forward step (`models.step.make_forward`,
what the engine's step wraps) is traced, lowered and compiled for one bucket (`--tokens` tokens of
`--seqs` sequences over `--pages` pages of 16 slots, bf16 pools), once with the layers unrolled and once
with `scan_layers`. Each cell is the wall time of `lower(...)` plus `.compile()` (nothing is cached in
process: every model is a new program; JAX's persistent cache is not enabled here), after one untimed
2-layer compile that pays the process's one-time costs. Ratios are deepest over
shallowest depth per form, all measured in this one run: the scan's should stay near 1 (the issue's target
is <= 1.5), the unrolled loop's grows with depth.
"""

from __future__ import annotations

import argparse
import json
import time

import jax.numpy as jnp
import numpy as np

from jaxserve.layers.attention_metadata import SequenceStep, build_attention_metadata
from jaxserve.models.build import random_model
from jaxserve.models.config import ModelConfig
from jaxserve.models.decoder import CausalLM, scan_layers
from jaxserve.models.step import make_forward

PAGE_SIZE = 16
_BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0,
             max_position_embeddings=4096)
ARCHS = {
    "llama": dict(architectures=["LlamaForCausalLM"], model_type="llama"),
    "qwen3": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3"),
    "gpt_oss": dict(architectures=["GptOssForCausalLM"], model_type="gpt_oss", num_local_experts=4,
                    num_experts_per_tok=2, sliding_window=128, attention_bias=True),
}


def tiny_config(arch: str, num_layers: int) -> ModelConfig:
    """The benchmark's tiny `arch` model with `num_layers` layers (gpt-oss: sliding, full, sliding, ...)."""
    raw = {**_BASE, **ARCHS[arch], "num_hidden_layers": num_layers}
    if arch == "gpt_oss":
        raw["layer_types"] = ["sliding_attention", "full_attention"] * (num_layers // 2)
    return ModelConfig.from_dict(raw)


def compile_seconds(model: CausalLM, tokens: int, seqs: int, pages: int) -> float:
    """Wall seconds to trace, lower and compile `model`'s forward for one bucket of `tokens` tokens from
    `seqs` sequences with `pages` pages each (prefill-shaped: the tokens split evenly)."""
    forward, params = make_forward(model)
    layout = model.kv_layout
    pools = layout.make_pools(seqs * pages, PAGE_SIZE, jnp.bfloat16)
    steps = []
    for s in range(seqs):
        own = list(range(1 + s * pages, 1 + (s + 1) * pages))
        steps.append(SequenceStep(tokens // seqs, tokens // seqs, own, own if layout.hybrid else None))
    meta = build_attention_metadata(steps, page_size=PAGE_SIZE, with_swa=layout.hybrid,
                                    token_buckets=(tokens,), seq_buckets=(seqs,), page_buckets=(pages,))
    ids = np.zeros(meta.num_tokens, np.int32)
    start = time.perf_counter()
    forward.lower(params, ids, meta, pools).compile()
    return time.perf_counter() - start


def run(arch: str, depths: list[int], tokens: int, seqs: int, pages: int) -> dict:
    """`{"rows": [{"layers", "unrolled_s", "scan_s"}...], "ratio_scan", "ratio_unrolled"}`; ratios are the
    deepest depth's time over the shallowest's."""
    compile_seconds(random_model(tiny_config(arch, 2), seed=0), tokens, seqs, pages)  # process warm-up
    rows = []
    for n in depths:
        model = random_model(tiny_config(arch, n), seed=0)
        unrolled = compile_seconds(model, tokens, seqs, pages)
        scanned = compile_seconds(scan_layers(model), tokens, seqs, pages)
        rows.append({"layers": n, "unrolled_s": round(unrolled, 3), "scan_s": round(scanned, 3)})
    first, last = rows[0], rows[-1]
    return {"arch": arch, "bucket": {"tokens": tokens, "seqs": seqs, "pages": pages}, "rows": rows,
            "ratio_scan": round(last["scan_s"] / first["scan_s"], 2),
            "ratio_unrolled": round(last["unrolled_s"] / first["unrolled_s"], 2)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m jaxserve.bench.compile",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--arch", choices=sorted(ARCHS), default="llama")
    parser.add_argument("--layers", type=int, nargs="+", default=[4, 32], help="depths, shallowest first")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--seqs", type=int, default=4)
    parser.add_argument("--pages", type=int, default=16, help="pages per sequence (16 slots each)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args(argv)
    if args.arch == "gpt_oss" and any(n % 2 for n in args.layers):
        parser.error("gpt_oss alternates sliding/full layers: give even depths")
    result = run(args.arch, sorted(args.layers), args.tokens, args.seqs, args.pages)
    if args.json:
        print(json.dumps(result))
        return
    b = result["bucket"]
    print(f"compile time of one bucket ({b['tokens']} tokens, {b['seqs']} seqs, {b['pages']} pages), "
          f"tiny {args.arch}")
    print(f"{'layers':>7} {'unrolled s':>11} {'scan s':>8}")
    for r in result["rows"]:
        print(f"{r['layers']:>7} {r['unrolled_s']:>11.3f} {r['scan_s']:>8.3f}")
    deep, shallow = result["rows"][-1]["layers"], result["rows"][0]["layers"]
    print(f"ratio {deep}/{shallow} layers: scan {result['ratio_scan']:.2f}, "
          f"unrolled {result['ratio_unrolled']:.2f}")


if __name__ == "__main__":
    main()
