"""Host cost per plain decode step against context length: batch B requests decoding at a short and a long
context, same run, on the embedded model.

    python -m jaxserve.bench.host_cost                          # batch 32, 128- vs 4096-token contexts
    python -m jaxserve.bench.host_cost --contexts 128 2048 --page-size 16

Per context length, B prompts share one long stem (the radix cache prefills it once) and differ in their
last 8 tokens, so every request attends over the whole context. After the prompts are prefilled and every
request decodes, `--steps` decode steps are timed; the plain stepper's `host_s` (scheduling, building the
step input, dispatch, applying results: everything but waiting for the device) per step is reported, with
its ratio to the shortest context's. Contexts alternate ABAB over `--repeats` rounds; the median is kept.
"""

from __future__ import annotations

import argparse
import json
import statistics

import numpy as np

from jaxserve.api import Engine
from jaxserve.assets import EMBEDDED_MODEL_DIR


def host_ms_per_step(engine: Engine, context: int, batch: int, steps: int, seed: int) -> float:
    """Decode `steps` steps of `batch` requests at `context` tokens of prompt; host ms per decode step."""
    rng = np.random.default_rng(seed)
    stem = rng.integers(0, engine.vocab_size, context - 8).tolist()
    params = {"temperature": 0.0, "max_new_tokens": steps + 4, "ignore_eos": True}
    rids = [engine.submit(input_ids=stem + rng.integers(0, engine.vocab_size, 8).tolist(),
                          sampling_params=params) for _ in range(batch)]
    reqs = [engine.request(r) for r in rids]
    while not all(r.output_ids for r in reqs):  # prefill (and the first decodes)
        engine.step()
    stats = engine.stats
    engine.step()
    before_host, before_steps = stats["host_s"], stats["steps"]
    for _ in range(steps):
        engine.step()
    ms = 1e3 * (stats["host_s"] - before_host) / (stats["steps"] - before_steps)
    engine.run_until_idle()
    for rid in rids:
        engine.forget(rid)
    engine.flush_cache()
    return ms


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-path", default=str(EMBEDDED_MODEL_DIR))
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--contexts", type=int, nargs="+", default=[128, 4096])
    p.add_argument("--steps", type=int, default=32, help="timed decode steps per context and repeat")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--page-size", type=int, default=1)
    args = p.parse_args(argv)
    longest = max(args.contexts) + args.steps + 16
    engine = Engine(model_path=args.model_path, page_size=args.page_size, chunked_prefill_size=2048,
                    max_total_tokens=longest + args.batch_size * (args.steps + 32),
                    max_running_requests=args.batch_size, context_length=longest)
    for context in args.contexts:  # compile every shape the timed rounds use
        host_ms_per_step(engine, context, args.batch_size, args.steps, seed=0)
    ms: dict[int, list[float]] = {c: [] for c in args.contexts}
    for rep in range(args.repeats):
        for context in args.contexts if rep % 2 == 0 else args.contexts[::-1]:
            ms[context].append(host_ms_per_step(engine, context, args.batch_size, args.steps, seed=rep + 1))
    base = statistics.median(ms[min(args.contexts)])
    row = {"batch_size": args.batch_size, "page_size": args.page_size, "steps": args.steps,
           "host_ms_per_decode_step": {c: round(statistics.median(v), 3) for c, v in ms.items()},
           "ratio_to_shortest": {c: round(statistics.median(v) / base, 3) for c, v in ms.items()},
           "all_ms": {c: [round(x, 3) for x in v] for c, v in ms.items()}}
    print(json.dumps(row), flush=True)
    return row


if __name__ == "__main__":
    main()
