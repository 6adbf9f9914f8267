"""Host time per EAGLE-3 round against the round's device time, and whether the overlap schedule hides it.

    python -m jaxserve.bench.round_host                    # batch 32, embedded model, chains of 2 steps
    python -m jaxserve.bench.round_host --batch-size 64 --repeats 7
    python -m jaxserve.bench.round_host --random-layers 4   # a gpt-oss-20b-shaped model, random weights

Two EAGLE-3 engines on the same checkpoint, both running rounds only (`--speculative-policy always`): one
with the overlap schedule (the default), one without (`disable_overlap_schedule`). Every timed pass
generates the same batch from an empty prefix cache; passes alternate ABBA. The stepper counts, per round
step, its wall seconds and its main thread's CPU seconds (`round_wall_s`, `round_host_cpu_s`: planning,
dispatch, reading and applying the verdict; a wait for the device costs the thread no CPU).

- host ms / round: the main thread's CPU per round (each engine's own).
- device ms / round: the synchronous engine's wall minus its host CPU per round. Without overlap the
  host plans and dispatches, then waits for the verdict, then applies it: the device runs while the host
  waits, so what is left of the wall is the device's time (a small overestimate of the host's share when
  the host runs past the dispatch before it waits).
- host / device: the overlapped engine's host CPU per round over that device time (the acceptance line:
  <= 25%).
- overlapped wall / device: the overlapped engine's wall per round over the device time (<= 1.1 when the
  overlap hides the host's work).
- dispatch ms / round: the part of the host CPU spent in the call that dispatches the round's program
  (argument signatures, packing, the executable call), each engine's own; dispatch / host is its share.

`--random-layers N` serves, instead of the embedded checkpoint, a random-weight model of gpt-oss-20b's
shapes with N layers and a random EAGLE-3 head of the published head's shapes (`bench.gpt_oss_e2e`; `--tiny`:
the embedded model's shapes), on 48-token random prompts. A random head accepts about no draft, which
changes little here: rounds run every step either way, and what is timed is the host's work per round
against the device's. The embedded model is so small that an accelerator runs its round in about the time
a host needs to plan it; a served model's layers are what the host's share is meant to be judged against.

On a CPU backend the device is XLA's threads on the same cores as the host thread: overlap cannot hide
host work there when XLA keeps every core busy, and host CPU seconds run slower beside a busy device
(shared caches). The figures that decide come from an accelerator; on a CPU they show the host's share.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
from pathlib import Path

import numpy as np

from jaxserve.api import Engine
from jaxserve.assets import EMBEDDED_MODEL_DIR
from jaxserve.bench import gpt_oss_e2e
from jaxserve.bench.speculative import prompts
from jaxserve.layers.backends import DEFAULT_BACKEND
from jaxserve.models.decoder import scan_layers

COUNTERS = ("round_steps", "round_wall_s", "round_host_cpu_s", "round_dispatch_cpu_s")


def timed_pass(engine: Engine, batch: list[list[int]], params: dict) -> dict[str, float]:
    """One generate of `batch` from an empty prefix cache: the round counters' increase during it."""
    engine.flush_cache()
    gc.collect()
    before = {k: engine.stats[k] for k in COUNTERS}
    engine.generate(input_ids=batch, sampling_params=params)
    return {k: engine.stats[k] - before[k] for k in COUNTERS}


def per_round_ms(passes: list[dict[str, float]]) -> dict[str, float]:
    """Median over passes of each pass's wall and host CPU ms per round."""
    return {kind: statistics.median(1e3 * p[f"round_{kind}"] / p["round_steps"] for p in passes)
            for kind in ("wall_s", "host_cpu_s", "dispatch_cpu_s")}


def summarize(overlap: list[dict[str, float]], sync: list[dict[str, float]]) -> dict[str, float]:
    """The module docstring's figures from both engines' timed passes (medians over passes)."""
    o, s = per_round_ms(overlap), per_round_ms(sync)
    device = statistics.median(1e3 * (p["round_wall_s"] - p["round_host_cpu_s"]) / p["round_steps"]
                               for p in sync)
    return {"device_ms_per_round": round(device, 3),
            "overlap_host_cpu_ms_per_round": round(o["host_cpu_s"], 3),
            "overlap_wall_ms_per_round": round(o["wall_s"], 3),
            "sync_host_cpu_ms_per_round": round(s["host_cpu_s"], 3),
            "sync_wall_ms_per_round": round(s["wall_s"], 3),
            "overlap_dispatch_cpu_ms_per_round": round(o["dispatch_cpu_s"], 3),
            "sync_dispatch_cpu_ms_per_round": round(s["dispatch_cpu_s"], 3),
            "overlap_dispatch_over_host": round(o["dispatch_cpu_s"] / o["host_cpu_s"], 3),
            "host_over_device": round(o["host_cpu_s"] / device, 3),
            "overlap_wall_over_device": round(o["wall_s"] / device, 3)}


def random_engines(num_layers: int, tiny: bool, batch_size: int, output_len: int, num_steps: int
                   ) -> tuple[dict[str, Engine], list[list[int]]]:
    """The overlapped and synchronous EAGLE-3 engines (rounds only) over one random-weight model and head
    (`gpt_oss_e2e.build`, shared by both engines, attending on the platform's default backend), and
    `batch_size` random 48-token prompts."""
    target_raw, head_raw = gpt_oss_e2e.configs(num_layers, tiny)
    model, draft = gpt_oss_e2e.build(DEFAULT_BACKEND, target_raw, head_raw)
    model = scan_layers(model)  # stacked once here: each engine would stack its own copy of the layers
    prompt_len, page_size = 48, 16
    longest = prompt_len + output_len + num_steps + 2
    pages = -(-longest // page_size) + 1
    common = dict(draft_model=draft, speculative_algorithm="EAGLE3", speculative_num_steps=num_steps,
                  speculative_policy="always", page_size=page_size, context_length=longest,
                  max_total_tokens=2 * batch_size * pages * page_size, chunked_prefill_size=2048,
                  max_running_requests=batch_size)
    engines = {"overlap": Engine(model=model, **common),
               "sync": Engine(model=model, **common, disable_overlap_schedule=True)}
    rng = np.random.default_rng(0)
    batch = rng.integers(1, target_raw["vocab_size"], (batch_size, prompt_len)).tolist()
    return engines, batch


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-path", default=str(EMBEDDED_MODEL_DIR))
    p.add_argument("--draft-path", default=None, help="default: <model-path>/draft")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--num-steps", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5, help="timed passes per engine")
    p.add_argument("--random-layers", type=int, default=0,
                   help="> 0: a random-weight gpt-oss-20b-shaped model of this many layers (see above)")
    p.add_argument("--tiny", action="store_true", help="with --random-layers: the embedded model's shapes")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    if args.tiny and not args.random_layers:
        p.error("--tiny goes with --random-layers")
    if args.random_layers:
        engines, batch = random_engines(args.random_layers, args.tiny, args.batch_size, args.output_len,
                                        args.num_steps)
    else:
        common = dict(model_path=args.model_path, speculative_algorithm="EAGLE3",
                      speculative_draft_model_path=args.draft_path or str(Path(args.model_path) / "draft"),
                      speculative_num_steps=args.num_steps, speculative_policy="always",
                      max_total_tokens=16384, chunked_prefill_size=2048, max_running_requests=args.batch_size)
        engines = {"overlap": Engine(**common), "sync": Engine(**common, disable_overlap_schedule=True)}
        batch = prompts(engines["sync"].tokenizer, args.batch_size)
    params = {"temperature": 0.0, "max_new_tokens": args.output_len, "ignore_eos": True}
    for engine in engines.values():  # compiles the shapes the timed passes use
        timed_pass(engine, batch, params)
    passes: dict[str, list[dict[str, float]]] = {name: [] for name in engines}
    for rep in range(args.repeats):
        for name in engines if rep % 2 == 0 else list(engines)[::-1]:
            passes[name].append(timed_pass(engines[name], batch, params))
    model = f"random gpt-oss-20b shapes, {args.random_layers} layers" if args.random_layers else "checkpoint"
    row = {"model": "random embedded shapes" if args.tiny else model,
           "batch_size": args.batch_size, "output_len": args.output_len, "num_steps": args.num_steps,
           "repeats": args.repeats, "rounds_per_pass": passes["overlap"][0]["round_steps"],
           **summarize(passes["overlap"], passes["sync"])}
    print(json.dumps(row), flush=True)
    return row


if __name__ == "__main__":
    main()
