"""Speculative decoding benchmark: output tokens/s with and without EAGLE-3 on the embedded model, one run.

    python -m jaxserve.bench.speculative                       # batch sizes 1, 8, 32, 64; 5 repeats
    python -m jaxserve.bench.speculative --batch-sizes 1 8 --output-len 32
    python -m jaxserve.bench.speculative --model-path DIR      # DIR/draft holds the EAGLE-3 head
    python -m jaxserve.bench.speculative --repeats 9           # timed passes per engine (default 5)

For each batch size B, B prompts (first docstring lines of standard-library callables, a text the embedded
model was trained on) decode `--output-len` tokens greedily, EOS ignored, on two engines over the same
weights: plain, and EAGLE-3 chain drafting (`--num-steps`, default 2, i.e. 3 tokens verified per round; or
tree drafting with `--topk K --num-draft-tokens N`).
Each engine runs the batch once untimed from an empty prefix cache (compiles its shapes, and lets the
adaptive policy measure both of its paths). Then `--repeats` timed passes per engine,
each from an empty prefix cache after a `gc.collect()`, alternating the engines in ABBA order (plain, spec,
spec, plain, ...) so drift and order effects (caches, clocks, other load) hit both alike. Every XLA
compilation in the process is counted (`jax.monitoring`'s backend-compile event) together with the
engines' own compile counters (`Engine.num_compiles`: every program of its stepper); a compilation
during a timed pass means that pass timed a compile: it is reported (`compiles_during_timing`) and warned
about on stderr.
Reported per batch size (one JSON line each, then a table): output tokens/s of both from the median wall time
of their timed passes (and from the fastest pass, `*_best`), every pass's wall time, the ratio of the medians
(`speedup`) and the median of the per-repeat ratios (`speedup_paired`), pooled acc_length (completion tokens /
verify rounds, last pass), the histogram of drafts accepted per round and the policy's choices (`--policy`,
default auto: EAGLE-3 rounds vs plain decode steps during the timed passes). Outputs of every pass of both
engines are compared token for token (greedy speculative decoding is lossless; repeated passes are
deterministic).
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import statistics
import string
import sys
import textwrap
import time
from pathlib import Path

import jax
import numpy as np

from jaxserve.api import Engine
from jaxserve.assets import EMBEDDED_MODEL_DIR


def prompts(tokenizer, count: int) -> list[list[int]]:
    lines = []
    for module in (string, textwrap, inspect, json, time, Path):
        for name in sorted(dir(module)):
            doc = (inspect.getdoc(getattr(module, name, None)) or "").strip().split("\n")[0]
            if len(doc.split()) >= 4:
                lines.append(doc)
    ids = [tokenizer.encode(line)[:48] for line in lines]
    return [ids[i % len(ids)] for i in range(count)]


COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class CompileCounter:
    """Counts XLA backend compilations in this process, of any jitted function (a context manager)."""

    def __init__(self) -> None:
        self.count = 0

    def _on_event(self, event: str, duration_secs: float, **kwargs) -> None:
        if event == COMPILE_EVENT:
            self.count += 1

    def __enter__(self) -> CompileCounter:
        jax.monitoring.register_event_duration_secs_listener(self._on_event)
        return self

    def __exit__(self, *exc) -> None:
        jax.monitoring.unregister_event_duration_listener(self._on_event)


def engine_compiles(engine: Engine) -> int:
    """The engine's own executables: every jitted program of its stepper, all bucket shapes."""
    return sum(engine.num_compiles.values())


# decode programs of an adaptive EAGLE-3 engine whose batch shapes depend on when the policy switches
ADAPTIVE_PROGRAMS = ("chain_round", "plain_capture", "catch_up")


def warm(engine: Engine, batch, params: dict) -> None:
    """The untimed pass(es), each from an empty prefix cache. An adaptive EAGLE-3 engine runs the batch
    once with rounds only and once with plain steps only (so both paths have compiled the shapes those
    reach), then once under its own policy (so it has measured both); and it compiles its rounds, plain
    steps and draft catch-ups at every sequence bucket up to the batch size, in the narrowest page-table
    width (under the adaptive policy requests finish at other steps, so the batch shrinks through other
    buckets, and a catch-up covers however many lagging requests finish together)."""
    policy = getattr(engine.stepper, "policy", None)
    forced = ("always", "never") if policy == "auto" else ()
    if policy == "auto":
        plan = [(prog, bucket, args) for prog, bucket, args in engine.stepper.warm_plan()
                if prog.name in ADAPTIVE_PROGRAMS]
        narrowest = min(bucket[-1] for _, bucket, _ in plan)
        for event in [prog.prepare(bucket, args) for prog, bucket, args in plan
                      if bucket[-1] == narrowest and bucket[-2] <= len(batch)]:
            event.wait()
    for p in (*forced, policy):
        if p is not None:
            engine.stepper.set_policy(p)
        engine.flush_cache()
        engine.generate(input_ids=batch, sampling_params=params)


def policy_choices(engine: Engine) -> dict[str, int]:
    """Decode steps so far by kind: EAGLE-3 rounds and plain steps (the adaptive policy's choices), and the
    requests that dropped their drafts once plain steps won."""
    stats = engine.stats
    return {k: stats[k] for k in ("round_steps", "plain_decode_steps", "drafts_dropped") if k in stats}


def paired_speedup(plain_walls: list[float], spec_walls: list[float]) -> float:
    """The median over repeats of plain wall / EAGLE-3 wall within each repeat. A repeat's two passes run
    back to back (ABBA), so a change of machine speed between repeats cancels in its ratio; it does not
    cancel in the ratio of the two medians, which can pair passes minutes apart. On a shared 2-core
    machine a fixed matmul loop's rate moved by +-35% from one 3 s window to the next, so both are
    reported."""
    return statistics.median(p / s for p, s in zip(plain_walls, spec_walls, strict=True))


def timed_pass(engine: Engine, batch, params: dict, counter: CompileCounter) -> tuple[float, list[dict], int]:
    """One generate of `batch` from an empty prefix cache: (wall s, outputs, compilations during it)."""
    engine.flush_cache()
    gc.collect()
    before, before_engine = counter.count, engine_compiles(engine)
    start = time.perf_counter()
    outs = engine.generate(input_ids=batch, sampling_params=params)
    wall = time.perf_counter() - start
    return wall, outs, max(counter.count - before, engine_compiles(engine) - before_engine)


def measure(engines: dict[str, Engine], batch, output_len: int, repeats: int,
            counter: CompileCounter) -> dict[str, dict]:
    """Untimed compile pass per engine, then `repeats` timed passes each in ABBA order. Per engine: wall
    times, outputs of the last pass, compilations during timed passes, whether all passes agreed."""
    params = {"temperature": 0.0, "max_new_tokens": output_len, "ignore_eos": True}
    for engine in engines.values():  # compile, from the empty cache every timed pass starts from
        warm(engine, batch, params)
    res = {name: {"walls": [], "outs": None, "compiles": 0, "deterministic": True, "choices": {}}
           for name in engines}
    names = list(engines)
    for rep in range(repeats):
        for name in names if rep % 2 == 0 else names[::-1]:
            before = policy_choices(engines[name])
            wall, outs, compiles = timed_pass(engines[name], batch, params, counter)
            r = res[name]
            for k, n in policy_choices(engines[name]).items():
                r["choices"][k] = r["choices"].get(k, 0) + n - before.get(k, 0)
            r["walls"].append(wall)
            r["compiles"] += compiles
            if r["outs"] is not None:
                r["deterministic"] &= [o["output_ids"] for o in outs] == [o["output_ids"] for o in r["outs"]]
            r["outs"] = outs
    return res


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-path", default=str(EMBEDDED_MODEL_DIR))
    p.add_argument("--draft-path", default=None, help="default: <model-path>/draft")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64])
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--num-steps", type=int, default=2)
    p.add_argument("--topk", type=int, default=1, help="> 1: tree drafting (needs --num-draft-tokens)")
    p.add_argument("--num-draft-tokens", type=int, default=None)
    # 3 passes of ~0.2-0.4 s each moved a ratio by 10-20% between runs on a quiet 2-core machine
    p.add_argument("--repeats", type=int, default=5, help="timed passes per engine and batch size")
    p.add_argument("--policy", default="auto", choices=("auto", "always", "never"),
                   help="--speculative-policy of the EAGLE-3 engine (auto: a round or a plain step per step)")
    p.add_argument("--disable-batch-size", type=int, default=None,
                   help="--speculative-disable-batch-size of the EAGLE-3 engine")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    draft_path = args.draft_path or str(Path(args.model_path) / "draft")
    common = dict(max_total_tokens=16384, chunked_prefill_size=2048,
                  max_running_requests=max(args.batch_sizes))
    plain = Engine(model_path=args.model_path, **common)
    spec = Engine(model_path=args.model_path, speculative_algorithm="EAGLE3",
                  speculative_draft_model_path=draft_path, speculative_num_steps=args.num_steps,
                  speculative_eagle_topk=args.topk, speculative_num_draft_tokens=args.num_draft_tokens,
                  speculative_policy=args.policy, speculative_disable_batch_size=args.disable_batch_size,
                  **common)
    results = {}
    with CompileCounter() as counter:
        for bs in args.batch_sizes:
            batch = prompts(plain.tokenizer, bs)
            res = measure({"plain": plain, "eagle3": spec}, batch, args.output_len, args.repeats, counter)
            outs_plain, outs_spec = res["plain"]["outs"], res["eagle3"]["outs"]
            tokens = sum(o["meta_info"]["completion_tokens"] for o in outs_spec)
            rounds = sum(o["meta_info"]["spec_verify_ct"] for o in outs_spec)
            accepted = np.concatenate([o["meta_info"]["spec_accept_lengths"] for o in outs_spec]).astype(int)
            med = {k: statistics.median(r["walls"]) for k, r in res.items()}
            best = {k: min(r["walls"]) for k, r in res.items()}
            compiles = {k: r["compiles"] for k, r in res.items()}
            row = {"batch_size": bs, "output_len": args.output_len, "num_steps": args.num_steps,
                   "topk": args.topk, "repeats": args.repeats,
                   "plain_tokens_per_s": round(tokens / med["plain"], 1),
                   "eagle3_tokens_per_s": round(tokens / med["eagle3"], 1),
                   "plain_tokens_per_s_best": round(tokens / best["plain"], 1),
                   "eagle3_tokens_per_s_best": round(tokens / best["eagle3"], 1),
                   "plain_walls_s": [round(w, 4) for w in res["plain"]["walls"]],
                   "eagle3_walls_s": [round(w, 4) for w in res["eagle3"]["walls"]],
                   "speedup": round(med["plain"] / med["eagle3"], 3),
                   "speedup_paired": round(paired_speedup(res["plain"]["walls"], res["eagle3"]["walls"]), 3),
                   "acc_length": round(tokens / rounds, 3),
                   "accepted_drafts_histogram": np.bincount(accepted, minlength=args.num_steps + 1).tolist(),
                   "compiles_during_timing": compiles,
                   "policy": args.policy, "policy_choices": res["eagle3"]["choices"],
                   "identical_outputs": res["plain"]["deterministic"] and res["eagle3"]["deterministic"]
                   and [o["output_ids"] for o in outs_plain] == [o["output_ids"] for o in outs_spec]}
            if any(compiles.values()):
                print(f"WARNING: batch {bs}: XLA compilations during timed passes {compiles}; those passes "
                      "include compile time", file=sys.stderr, flush=True)
            results[bs] = row
            print(json.dumps(row), flush=True)
    print(f"\n{'batch':>5} {'plain tok/s':>12} {'(best)':>8} {'eagle3 tok/s':>13} {'(best)':>8} "
          f"{'speedup':>8} {'paired':>7} {'acc_len':>8} {'rounds':>7} {'plain':>6} {'dropped':>8}  histogram")
    for bs, r in results.items():
        c = r["policy_choices"]
        print(f"{bs:>5} {r['plain_tokens_per_s']:>12} {r['plain_tokens_per_s_best']:>8} "
              f"{r['eagle3_tokens_per_s']:>13} {r['eagle3_tokens_per_s_best']:>8} {r['speedup']:>8} "
              f"{r['speedup_paired']:>7} "
              f"{r['acc_length']:>8} {c.get('round_steps', 0):>7} {c.get('plain_decode_steps', 0):>6} "
              f"{c.get('drafts_dropped', 0):>8}  "
              f"{r['accepted_drafts_histogram']}")
    print(f"(tok/s: median of {args.repeats} timed passes per engine, ABBA order; best: fastest pass; "
          "speedup: ratio of the medians; paired: median of each repeat's own ratio (its two passes ran "
          "back to back); "
          f"rounds / plain: EAGLE-3 decode steps of each kind over the timed passes, policy {args.policy}; "
          "dropped: requests that gave up their draft once plain steps won; "
          "acc_len counts a plain step as a round that accepted no draft)")
    return results


if __name__ == "__main__":
    main()
