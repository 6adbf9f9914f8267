"""Host cost per plain decode step against context length: batch B requests decoding at a short and a long
context, same run, on the embedded model.

    python -m jaxserve.bench.host_cost                          # batch 32, 128- vs 4096-token contexts
    python -m jaxserve.bench.host_cost --contexts 128 2048 --page-size 16

Per context length, B prompts share one long stem (the radix cache prefills it once) and differ in their
last 8 tokens, so every request attends over the whole context. After the prompts are prefilled and every
request decodes, `--steps` decode steps are timed. The plain stepper's host work per step (scheduling,
building the step input, dispatch, applying results: everything but waiting for the device) is reported
two ways, each with its ratio to the shortest context's:

- `host_only`: the same `PlainStepper`, `KVCache` and step builder over a runner whose program takes the
  step's arrays and returns scripted tokens (`ScriptedRunner`): the host's whole work, dispatch and
  transfers included, with no model running beside it on the same cores. This is the host cost itself.
- `engine`: the real engine, its main thread's CPU time (`host_cpu_s`) and wall time (`host_s`) of the same
  work, and the device wait. On a CPU backend the device's threads run on the same cores as the host
  thread, and a long context's attention keeps them busy through the host's work: the wall time then
  stretches with the context though the host does no more, and even the CPU time grows (shared caches).
  On an accelerator the two clocks agree with `host_only`.

Contexts alternate ABAB over `--repeats` rounds. The engine's figures are medians. The host-only side runs
3 passes per context and round (they are cheap), the contexts alternating pass by pass, and reports three
figures: the fastest pass per context (its work is the same every pass, so anything slower only measures
the machine: one run's passes of the same work spread by up to 2x on a shared 2-core machine), the median
pass, and the paired ratio, the median over passes of each pass against the shortest context's pass run
just before or after it (`host_only_paired_ratio`). The paired ratio is the one to judge by: the machine's
speed moves between the seconds a run takes, and two fastest passes can come from different spells (one
run: 1.53 from the fastest passes, 1.46 from the medians, with no change in the work).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.api import Engine
from jaxserve.assets import EMBEDDED_MODEL_DIR
from jaxserve.engine.kv_cache import KVCache
from jaxserve.engine.request import make_request
from jaxserve.engine.step_input import StepInput
from jaxserve.engine.stepper import PlainStepper
from jaxserve.sampling import SampleOutput, SamplingParams
from jaxserve.sampling.params import MAX_TOP_LOGPROBS

CLOCKS = ("host_cpu_s", "host_s", "device_wait_s")  # the stepper's counters this bench reports per step
HOST_ONLY_PASSES = 3  # host-only passes per context and round


def host_ms_per_step(engine: Engine, context: int, batch: int, steps: int, seed: int) -> dict[str, float]:
    """Decode `steps` steps of `batch` requests at `context` tokens of prompt: ms per decode step of each
    counter in `CLOCKS` (host CPU, host wall, waiting for the device)."""
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
    before = {k: stats[k] for k in (*CLOCKS, "steps")}
    for _ in range(steps):
        engine.step()
    num_steps = stats["steps"] - before["steps"]
    ms = {k: 1e3 * (stats[k] - before[k]) / num_steps for k in CLOCKS}
    engine.run_until_idle()
    for rid in rids:
        engine.forget(rid)
    engine.flush_cache()
    return ms


@functools.partial(jax.jit, keep_unused=True)
def _scripted_sample(inp: StepInput, token: jax.Array) -> SampleOutput:
    """`token` for every sampling row. Takes the whole step input (`keep_unused`: every array is still
    transferred), so a call costs the host what a model step's dispatch does, and the device nothing."""
    rows = inp.meta.kv_lens.shape[0]
    return SampleOutput(jnp.full(rows, token, jnp.int32), jnp.zeros(rows, jnp.float32),
                        jnp.zeros((rows, MAX_TOP_LOGPROBS), jnp.int32),
                        jnp.zeros((rows, MAX_TOP_LOGPROBS), jnp.float32))


class ScriptedRunner:
    """The part of `ModelRunner` a `PlainStepper` calls, with no model: every sampling row gets `token`
    (`_scripted_sample`: the step's arrays go to the device as for a model step, and nothing runs there)."""

    def __init__(self, token: int) -> None:
        self.token = jnp.int32(token)

    def set_penalty_row(self, row: int, prompt_ids: np.ndarray, output_ids: list[int]) -> None:
        raise ValueError("the host-only bench runs no penalties")

    def run(self, inp: StepInput) -> SampleOutput:
        return _scripted_sample(inp, self.token)


def host_only_ms_per_step(stepper: PlainStepper, kv: KVCache, vocab_size: int, context: int, batch: int,
                          steps: int, seed: int) -> float:
    """`host_ms_per_step`'s workload through `stepper` (over a `ScriptedRunner`): host CPU ms per decode
    step."""
    rng = np.random.default_rng(seed)
    stem = rng.integers(0, vocab_size, context - 8)
    params = SamplingParams(max_new_tokens=steps + 4, temperature=0.0, ignore_eos=True)
    reqs = [make_request(f"h{seed}-{i}", np.concatenate([stem, rng.integers(0, vocab_size, 8)]), params,
                         tree_root=kv.tree.root, seed=0) for i in range(batch)]
    for req in reqs:
        stepper.scheduler.add(req)
    while not all(r.output_ids for r in reqs):
        stepper.step()
    stats = stepper.stats
    stepper.step()
    before, before_steps = stats["host_cpu_s"], stats["steps"]
    for _ in range(steps):
        stepper.step()
    ms = 1e3 * (stats["host_cpu_s"] - before) / (stats["steps"] - before_steps)
    while not stepper.idle:
        stepper.step()
    kv.flush()
    return ms


def ratios(ms: dict[int, float]) -> dict[int, float]:
    shortest = ms[min(ms)]
    return {c: round(v / shortest, 3) for c, v in ms.items()}


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
    kv = KVCache(engine.model.config, num_pages=engine.kv.num_pages, page_size=args.page_size,
                 kv_dtype=engine.model.config.jnp_dtype, disable_radix_cache=False,
                 swa_num_pages=engine.kv.swa_num_pages)
    host_only = PlainStepper(kv, ScriptedRunner(token=3), engine.buckets, max_tokens=2048,
                             max_running=args.batch_size)
    for context in args.contexts:  # compile every shape the timed rounds use
        host_ms_per_step(engine, context, args.batch_size, args.steps, seed=0)
        host_only_ms_per_step(host_only, kv, engine.vocab_size, context, args.batch_size, args.steps, seed=0)
    ms: dict[int, list[dict[str, float]]] = {c: [] for c in args.contexts}
    only: dict[int, list[float]] = {c: [] for c in args.contexts}
    for rep in range(args.repeats):
        order = args.contexts if rep % 2 == 0 else args.contexts[::-1]
        for _ in range(HOST_ONLY_PASSES):  # the contexts pass by pass: each pass beside the others' same pass
            for context in order:
                only[context].append(host_only_ms_per_step(host_only, kv, engine.vocab_size, context,
                                                           args.batch_size, args.steps, seed=rep + 1))
        for context in order:
            ms[context].append(host_ms_per_step(engine, context, args.batch_size, args.steps, seed=rep + 1))
    med = {k: {c: statistics.median(m[k] for m in v) for c, v in ms.items()} for k in CLOCKS}
    fastest = {c: min(v) for c, v in only.items()}
    typical = {c: statistics.median(v) for c, v in only.items()}
    shortest = min(args.contexts)
    paired = {c: round(statistics.median(x / y for x, y in zip(v, only[shortest], strict=True)), 3)
              for c, v in only.items()}
    row = {"batch_size": args.batch_size, "page_size": args.page_size, "steps": args.steps,
           "host_only_ms_per_decode_step": {c: round(v, 3) for c, v in fastest.items()},
           "host_only_ratio_to_shortest": ratios(fastest),
           "host_only_median_ms": {c: round(v, 3) for c, v in typical.items()},
           "host_only_median_ratio": ratios(typical),
           "host_only_paired_ratio": paired,
           "engine_host_cpu_ms_per_decode_step": {c: round(v, 3) for c, v in med["host_cpu_s"].items()},
           "engine_host_cpu_ratio_to_shortest": ratios(med["host_cpu_s"]),
           "engine_host_wall_ms_per_decode_step": {c: round(v, 3) for c, v in med["host_s"].items()},
           "engine_host_wall_ratio_to_shortest": ratios(med["host_s"]),
           "device_wait_ms_per_decode_step": {c: round(v, 3) for c, v in med["device_wait_s"].items()},
           "all_host_only_ms": {c: [round(x, 3) for x in v] for c, v in only.items()}}
    print(json.dumps(row), flush=True)
    return row


if __name__ == "__main__":
    main()
