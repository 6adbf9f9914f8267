"""Offline engine benchmark: throughput and prefill work with the radix cache on vs off, in one run.

    python -m jaxserve.bench.offline                  # 64 requests per workload
    python -m jaxserve.bench.offline --requests 16    # quick run

Model: a tiny random Llama (hidden 64, 2 layers, vocab 512, float32), built in-process; no checkpoint.
Workloads, the same requests for both engines (greedy, ignore_eos, fixed output length):
(a) random: prompts of random tokens, uniform lengths in [prompt_len / 2, prompt_len];
(b) shared prefix: one random `prefix_len`-token "system prompt" + a random `suffix_len`-token suffix each.
Each engine first runs the workload once untimed (compiles every shape the run needs), then both run it
`--repeats` times from an empty cache, alternating; the median pass is reported. Reported per workload:
total tokens/s (prompt + output) over wall time per engine, prompt tokens requested vs computed, and the
on/off ratios. For (b) the expected cut in computed prompt tokens is the shared share
`prefix_len / (prefix_len + suffix_len)`, at best (N - 1) / N of it as the first request computes the
prefix once (the overlap schedule admits the next arrivals one step before the first prompt reaches the
tree, so one more computes it); the run checks the cut is within 5 points of the share.
(c) overlap: decode-heavy traffic (max_running_requests prompts, 4x the output length) with the overlap
schedule on vs off, cache on: tokens/s ratio and host vs device-wait milliseconds per step.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from jaxserve.api import Engine
from jaxserve.engine.step_input import Buckets
from jaxserve.models.build import random_model
from jaxserve.models.config import ModelConfig

VOCAB = 512
CONFIG = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=VOCAB, hidden_size=64,
              intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=4096)


def workloads(args) -> dict[str, list[list[int]]]:
    rng = np.random.RandomState(args.seed)
    lengths = rng.randint(args.prompt_len // 2, args.prompt_len + 1, size=args.requests)
    random_prompts = [rng.randint(0, VOCAB, size=n).tolist() for n in lengths]
    prefix = rng.randint(0, VOCAB, size=args.prefix_len).tolist()
    shared = [prefix + rng.randint(0, VOCAB, size=args.suffix_len).tolist() for _ in range(args.requests)]
    return {"random": random_prompts, "shared_prefix": shared}


def timed_pass(engine: Engine, batch: list[list[int]], output_len: int) -> dict:
    """One pass from an empty cache: wall time, prompt tokens computed, outputs."""
    params = {"temperature": 0.0, "max_new_tokens": output_len, "ignore_eos": True}
    engine.flush_cache()
    computed_before = engine.num_prompt_tokens_computed
    start = time.perf_counter()
    outs = engine.generate(input_ids=batch, sampling_params=params)
    wall = time.perf_counter() - start
    prompt_tokens = sum(len(p) for p in batch)
    output_tokens = sum(len(o["output_ids"]) for o in outs)
    return {"wall_s": wall, "tokens_per_s": (prompt_tokens + output_tokens) / wall,
            "output_tokens_per_s": output_tokens / wall, "prompt_tokens": prompt_tokens,
            "prompt_tokens_computed": engine.num_prompt_tokens_computed - computed_before,
            "outputs": [o["output_ids"] for o in outs]}


def run_pair(engines: dict[str, Engine], batch: list[list[int]], output_len: int, repeats: int) -> dict:
    """A first untimed pass per engine (compiles the shapes the run needs), then `repeats` timed passes
    alternating the engines (load from other processes hits both alike); the median pass by wall time."""
    for engine in engines.values():
        timed_pass(engine, batch, output_len)
    passes = {name: [] for name in engines}
    for _ in range(repeats):
        for name, engine in engines.items():
            passes[name].append(timed_pass(engine, batch, output_len))
    return {name: sorted(p, key=lambda r: r["wall_s"])[len(p) // 2] for name, p in passes.items()}


def overlap_report(model, args, buckets: Buckets, max_tokens: int) -> dict:
    """(c) decode-heavy traffic with the overlap schedule on vs off (`disable_overlap_schedule`): tokens/s,
    and per step the host time (schedule + build + apply) and the time blocked reading the device."""
    rng = np.random.RandomState(args.seed + 1)
    num = args.max_running_requests
    batch = [rng.randint(0, VOCAB, size=args.prompt_len // 2).tolist() for _ in range(num)]
    engines = {mode: Engine(model=model, page_size=args.page_size, max_total_tokens=max_tokens,
                            chunked_prefill_size=args.chunked_prefill_size,
                            max_running_requests=args.max_running_requests, buckets=buckets,
                            disable_overlap_schedule=mode == "sync") for mode in ("overlap", "sync")}
    for engine in engines.values():
        timed_pass(engine, batch, 4 * args.output_len)  # compiles; the per-step times below exclude it
        engine.stats.update(steps=0, host_s=0.0, host_cpu_s=0.0, device_wait_s=0.0)
    best = run_pair(engines, batch, 4 * args.output_len, args.repeats)
    row = {f"tokens_per_s_{mode}": r["tokens_per_s"] for mode, r in best.items()}
    row["throughput_ratio_overlap_sync"] = row["tokens_per_s_overlap"] / row["tokens_per_s_sync"]
    for mode, engine in engines.items():
        steps = max(engine.stats["steps"], 1)
        row[f"host_ms_per_step_{mode}"] = 1e3 * engine.stats["host_s"] / steps
        row[f"host_cpu_ms_per_step_{mode}"] = 1e3 * engine.stats["host_cpu_s"] / steps
        row[f"device_wait_ms_per_step_{mode}"] = 1e3 * engine.stats["device_wait_s"] / steps
    row["same_outputs"] = best["overlap"]["outputs"] == best["sync"]["outputs"]
    return row


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--prefix-len", type=int, default=448)
    parser.add_argument("--suffix-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--chunked-prefill-size", type=int, default=512)
    parser.add_argument("--max-running-requests", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per engine (median reported)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args(argv)

    model = random_model(ModelConfig.from_dict(CONFIG), seed=args.seed)
    longest = max(args.prompt_len, args.prefix_len + args.suffix_len) + args.output_len
    max_tokens = args.max_running_requests * longest + args.page_size * args.max_running_requests
    max_pages = -(-4096 // args.page_size)
    buckets = Buckets((16, 64, 128, args.chunked_prefill_size), (args.max_running_requests,),
                      (-(-longest // args.page_size), max_pages))
    engines = {cache: Engine(model=model, page_size=args.page_size, max_total_tokens=max_tokens,
                             chunked_prefill_size=args.chunked_prefill_size,
                             max_running_requests=args.max_running_requests, buckets=buckets,
                             disable_radix_cache=cache == "off")
               for cache in ("on", "off")}
    report = {}
    for name, batch in workloads(args).items():
        results = run_pair(engines, batch, args.output_len, args.repeats)
        on, off = results["on"], results["off"]
        row = {
            "tokens_per_s_on": on["tokens_per_s"], "tokens_per_s_off": off["tokens_per_s"],
            "throughput_ratio_on_off": on["tokens_per_s"] / off["tokens_per_s"],
            "prompt_tokens_requested": on["prompt_tokens"],
            "prompt_tokens_computed_on": on["prompt_tokens_computed"],
            "prompt_tokens_computed_off": off["prompt_tokens_computed"],
            "computed_cut": 1 - on["prompt_tokens_computed"] / off["prompt_tokens_computed"],
            "same_outputs": on["outputs"] == off["outputs"],
        }
        if name == "shared_prefix":
            row["shared_share"] = args.prefix_len / (args.prefix_len + args.suffix_len)
            # the first request computes the prefix once: the best possible cut is (N - 1) / N of the share
            row["ideal_cut"] = row["shared_share"] * (len(batch) - 1) / len(batch)
            row["cut_within_5_points"] = abs(row["computed_cut"] - row["shared_share"]) <= 0.05
        report[name] = row
    report["overlap"] = overlap_report(model, args, buckets, max_tokens)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        for name, row in report.items():
            print(f"[{name}]")
            for key, value in row.items():
                print(f"  {key:32s} {value:.3f}" if isinstance(value, float) else f"  {key:32s} {value}")
    return report


if __name__ == "__main__":
    main()
