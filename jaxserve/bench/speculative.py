"""Speculative decoding benchmark: output tokens/s with and without EAGLE-3 on the embedded model, one run.

    python -m jaxserve.bench.speculative                       # batch sizes 1, 8, 32
    python -m jaxserve.bench.speculative --batch-sizes 1 8 --output-len 32
    python -m jaxserve.bench.speculative --model-path DIR      # DIR/draft holds the EAGLE-3 head

For each batch size B, B prompts (first docstring lines of standard-library callables, a text the embedded
model was trained on) decode `--output-len` tokens greedily, EOS ignored, on two engines over the same
weights: plain, and EAGLE-3 chain drafting (`--num-steps`, default 2, i.e. 3 tokens verified per round; or
tree drafting with `--topk K --num-draft-tokens N`).
Each engine runs the batch once untimed (compiles its shapes), then once timed from an empty prefix cache.
Reported per batch size (one JSON line each, then a table): output tokens/s of both, their ratio, pooled
acc_length (completion tokens / verify rounds) and the histogram of drafts accepted per round. Outputs of
the two engines are compared token for token (greedy speculative decoding is lossless).
"""

from __future__ import annotations

import argparse
import inspect
import json
import string
import textwrap
import time
from pathlib import Path

import numpy as np

from jaxserve.assets import EMBEDDED_MODEL_DIR
from jaxserve.engine import Engine


def prompts(tokenizer, count: int) -> list[list[int]]:
    lines = []
    for module in (string, textwrap, inspect, json, time, Path):
        for name in sorted(dir(module)):
            doc = (inspect.getdoc(getattr(module, name, None)) or "").strip().split("\n")[0]
            if len(doc.split()) >= 4:
                lines.append(doc)
    ids = [tokenizer.encode(line)[:48] for line in lines]
    return [ids[i % len(ids)] for i in range(count)]


def timed(engine: Engine, batch, output_len: int) -> tuple[float, list[dict]]:
    params = {"temperature": 0.0, "max_new_tokens": output_len, "ignore_eos": True}
    engine.generate(input_ids=batch, sampling_params=params)  # compile
    engine.flush_cache()
    start = time.perf_counter()
    outs = engine.generate(input_ids=batch, sampling_params=params)
    return time.perf_counter() - start, outs


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-path", default=str(EMBEDDED_MODEL_DIR))
    p.add_argument("--draft-path", default=None, help="default: <model-path>/draft")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--num-steps", type=int, default=2)
    p.add_argument("--topk", type=int, default=1, help="> 1: tree drafting (needs --num-draft-tokens)")
    p.add_argument("--num-draft-tokens", type=int, default=None)
    args = p.parse_args(argv)
    draft_path = args.draft_path or str(Path(args.model_path) / "draft")
    common = dict(max_total_tokens=16384, chunked_prefill_size=2048,
                  max_running_requests=max(args.batch_sizes))
    plain = Engine(model_path=args.model_path, **common)
    spec = Engine(model_path=args.model_path, speculative_algorithm="EAGLE3",
                  speculative_draft_model_path=draft_path, speculative_num_steps=args.num_steps,
                  speculative_eagle_topk=args.topk, speculative_num_draft_tokens=args.num_draft_tokens,
                  **common)
    results = {}
    for bs in args.batch_sizes:
        batch = prompts(plain.tokenizer, bs)
        wall_plain, outs_plain = timed(plain, batch, args.output_len)
        wall_spec, outs_spec = timed(spec, batch, args.output_len)
        tokens = sum(o["meta_info"]["completion_tokens"] for o in outs_spec)
        rounds = sum(o["meta_info"]["spec_verify_ct"] for o in outs_spec)
        accepted = np.concatenate([o["meta_info"]["spec_accept_lengths"] for o in outs_spec]).astype(int)
        row = {"batch_size": bs, "output_len": args.output_len, "num_steps": args.num_steps,
               "topk": args.topk,
               "plain_tokens_per_s": round(tokens / wall_plain, 1),
               "eagle3_tokens_per_s": round(tokens / wall_spec, 1),
               "speedup": round(wall_plain / wall_spec, 3), "acc_length": round(tokens / rounds, 3),
               "accepted_drafts_histogram": np.bincount(accepted, minlength=args.num_steps + 1).tolist(),
               "identical_outputs": [o["output_ids"] for o in outs_plain] ==
                                    [o["output_ids"] for o in outs_spec]}
        results[bs] = row
        print(json.dumps(row), flush=True)
    print(f"\n{'batch':>5} {'plain tok/s':>12} {'eagle3 tok/s':>13} {'speedup':>8} {'acc_len':>8}  histogram")
    for bs, r in results.items():
        print(f"{bs:>5} {r['plain_tokens_per_s']:>12} {r['eagle3_tokens_per_s']:>13} {r['speedup']:>8} "
              f"{r['acc_length']:>8}  {r['accepted_drafts_histogram']}")
    return results


if __name__ == "__main__":
    main()
