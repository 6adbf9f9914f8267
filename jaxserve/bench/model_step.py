"""Model-step benchmark: one model step of the embedded checkpoint, per attention backend (and HF).

    python -m jaxserve.bench.model_step                 # native and xla
    python -m jaxserve.bench.model_step --compare-hf    # + Hugging Face transformers, same process, same run
    python -m jaxserve.bench.model_step --rows prefill-128 decode-8x2048 --repeats 9

Rows: one prefill step of 128 / 512 / 2,048 / 8,192 tokens (one sequence, nothing cached), and one decode
step of 8 sequences whose contexts (the new token included) are 128 or 2,048 tokens. Prompts are seeded
random token ids, the same for every backend.

jaxserve: the model's jitted step (`make_forward`, donated pools) compiled ahead of time, page_size 1,
float32 KV, the default metadata buckets; a decode row's pools are first filled by prefilling the
contexts with the `xla` model (the same pool values for every backend). HF: `AutoModelForCausalLM` on
the same checkpoint, eager attention and experts, float32, `torch.no_grad`; prefill runs the prompt with
a fresh cache, decode runs one token per sequence on a cache of the context cropped back after each call.
Timing: after one untimed call per backend, up to `--repeats` calls per backend, interleaved in ABBA order
(native, xla, hf, hf, xla, native, ...), each backend stopping early once its timed calls exceed
`--budget-s`; the median is reported. `agree`: whether every backend's greedy next tokens (argmax of the
step's sampled logits) are equal. Ratios: time / HF time; the last line gives each backend's decode time
at 2,048-token contexts over that at 128. Compare ratios across machines, not times.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.assets import EMBEDDED_MODEL_DIR
from jaxserve.layers.attention_metadata import SequenceStep, build_attention_metadata

ROWS: dict[str, tuple[str, int, int]] = {  # name: (kind, sequences, tokens per prompt / context)
    "prefill-128": ("prefill", 1, 128),
    "prefill-512": ("prefill", 1, 512),
    "prefill-2048": ("prefill", 1, 2048),
    "prefill-8192": ("prefill", 1, 8192),
    "decode-8x128": ("decode", 8, 128),
    "decode-8x2048": ("decode", 8, 2048),
}
LABELS = {"prefill": "prefill, {n:,} tokens", "decode": "decode step, batch {b}, {n:,}-token contexts"}
StepFn = Callable[[], np.ndarray]  # one timed call; returns the greedy next tokens
Prepared = tuple[Callable[[], None], StepFn]  # (untimed set-up before each call, the call)


def prompt_ids(num_seqs: int, num_tokens: int, vocab: int, seed: int = 0) -> np.ndarray:
    return np.random.RandomState(seed).randint(1, vocab, size=(num_seqs, num_tokens)).astype(np.int32)


class JaxserveStep:
    """The embedded model under one attention backend: builds a row's step and returns its call."""

    def __init__(self, backend: str):
        from jaxserve.loader.load import load_model
        from jaxserve.models.step import make_forward

        self.model = load_model(EMBEDDED_MODEL_DIR, backend=backend, progress=False)
        self.forward, self.params = make_forward(self.model)

    def meta(self, steps: list[SequenceStep]):
        return build_attention_metadata(steps, page_size=1, with_swa=self.model.kv_layout.hybrid)

    def prefill_pools(self, prompts: np.ndarray, pages: list[list[int]], num_pages: int):
        """Pools of `num_pages` pages holding every prompt's K/V at its pages (one prefill per prompt)."""
        pools = self.model.kv_layout.make_pools(num_pages, 1, jnp.float32)
        for ids, own in zip(prompts, pages, strict=True):
            meta = self.meta([SequenceStep(len(ids), len(ids), own, own)])
            tokens = np.zeros(meta.num_tokens, np.int32)
            tokens[: len(ids)] = ids
            _, pools, _ = self.forward(self.params, tokens, meta, pools)
        return pools

    def step(self, kind: str, prompts: np.ndarray, pools=None) -> Prepared:
        """A compiled call of one prefill (`prompts [1, n]`) or one decode step (`prompts [b, n]`: the
        last token of each is the new one, the others are in `pools`)."""
        num_seqs, num_tokens = prompts.shape
        pages = [list(range(1 + s * num_tokens, 1 + (s + 1) * num_tokens)) for s in range(num_seqs)]
        if kind == "prefill":
            steps = [SequenceStep(num_tokens, num_tokens, pages[0], pages[0])]
            ids = prompts[0]
            state = {"pools": self.model.kv_layout.make_pools(num_tokens, 1, jnp.float32)}
        else:
            steps = [SequenceStep(1, num_tokens, own, own) for own in pages]
            ids = prompts[:, -1]
            state = {"pools": pools}
        meta = self.meta(steps)
        tokens = np.zeros(meta.num_tokens, np.int32)
        tokens[: len(ids)] = ids
        tokens, meta = jax.device_put((tokens, meta))
        compiled = self.forward.lower(self.params, tokens, meta, state["pools"]).compile()

        def call() -> np.ndarray:
            logits, state["pools"], _ = compiled(self.params, tokens, meta, state["pools"])
            return np.asarray(jnp.argmax(logits[:num_seqs], axis=-1))

        return (lambda: None), call


class HFStep:
    """transformers' model of the embedded checkpoint (eager attention and experts, float32)."""

    def __init__(self, num_threads: int | None = None):
        import torch
        from transformers import AutoModelForCausalLM

        if num_threads is not None:
            torch.set_num_threads(num_threads)
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(
            EMBEDDED_MODEL_DIR, attn_implementation="eager", dtype=torch.float32,
            local_files_only=True).eval()
        self.model.config._experts_implementation = "eager"

    def step(self, kind: str, prompts: np.ndarray) -> Prepared:
        """Prefill: the prompt on a fresh cache. Decode: the last tokens on a copy of the context's cache
        (copied before each call, untimed)."""
        torch = self.torch
        ids = torch.tensor(prompts, dtype=torch.long)
        if kind == "prefill":
            def call() -> np.ndarray:
                with torch.no_grad():
                    logits = self.model(ids, use_cache=True).logits
                return logits[:, -1].argmax(-1).numpy()

            return (lambda: None), call
        with torch.no_grad():
            context = self.model(ids[:, :-1], use_cache=True).past_key_values
        state = {}

        def setup() -> None:
            state["cache"] = copy.deepcopy(context)

        def call() -> np.ndarray:
            with torch.no_grad():
                logits = self.model(ids[:, -1:], past_key_values=state["cache"], use_cache=True).logits
            return logits[:, -1].argmax(-1).numpy()

        return setup, call


def time_row(calls: dict[str, Prepared], repeats: int, budget_s: float) -> tuple[dict[str, float], bool]:
    """Median seconds per call of each backend (ABBA order, one untimed call first) and greedy agreement."""
    tokens = {}
    for name, (setup, call) in calls.items():
        setup()
        tokens[name] = call()
    agree = all(np.array_equal(t, next(iter(tokens.values()))) for t in tokens.values())
    samples: dict[str, list[float]] = {name: [] for name in calls}
    order = list(calls)
    for r in range(repeats):
        for name in order if r % 2 == 0 else order[::-1]:
            if samples[name] and sum(samples[name]) > budget_s:
                continue
            setup, call = calls[name]
            setup()
            start = time.perf_counter()
            call()
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(s) for name, s in samples.items()}, agree


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--compare-hf", action="store_true", help="also time Hugging Face transformers")
    parser.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS))
    parser.add_argument("--backends", nargs="+", default=["native", "xla"])
    parser.add_argument("--repeats", type=int, default=5, help="most timed calls per backend and row")
    parser.add_argument("--torch-threads", type=int, default=None,
                        help="torch.set_num_threads for HF (default: torch's, one per core); 1 is fairer to "
                             "HF when other processes load the cores (its threads spin-wait)")
    parser.add_argument("--budget-s", type=float, default=20.0,
                        help="a backend stops sampling a row once its timed calls exceed this")
    args = parser.parse_args(argv)

    steps = {name: JaxserveStep(name) for name in args.backends}
    hf = HFStep(args.torch_threads) if args.compare_hf else None
    vocab = next(iter(steps.values())).model.config.vocab_size
    names = [*args.backends, *(["hf"] if hf else [])]
    header = ["work", *(f"{n} ms" for n in names), *(f"{n} / hf" for n in args.backends if hf), "agree"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    results: dict[str, dict[str, float]] = {}
    for row in args.rows:
        kind, num_seqs, num_tokens = ROWS[row]
        prompts = prompt_ids(num_seqs, num_tokens, vocab)
        pools = None
        if kind == "decode":
            filler = steps.get("xla") or next(iter(steps.values()))
            pages = [list(range(1 + s * num_tokens, 1 + (s + 1) * num_tokens)) for s in range(num_seqs)]
            pools = filler.prefill_pools(prompts[:, :-1], [own[:-1] for own in pages], num_seqs * num_tokens)
        calls = {name: s.step(kind, prompts, jax.tree.map(jnp.copy, pools) if pools else None)
                 for name, s in steps.items()}
        if hf:
            calls["hf"] = hf.step(kind, prompts)
        medians, agree = time_row(calls, args.repeats, args.budget_s)
        results[row] = medians
        cells = [LABELS[kind].format(n=num_tokens, b=num_seqs), *(f"{medians[n] * 1e3:,.1f}" for n in names)]
        cells += [f"{medians[n] / medians['hf']:.2f}x" for n in args.backends if hf]
        print("| " + " | ".join([*cells, "yes" if agree else "NO"]) + " |", flush=True)
    if {"decode-8x128", "decode-8x2048"} <= set(results):
        long, short = results["decode-8x2048"], results["decode-8x128"]
        growth = ", ".join(f"{n} {long[n] / short[n]:.2f}x" for n in names)
        print(f"decode step, 2,048- vs 128-token contexts: {growth}")
    threads = f", torch threads {hf.torch.get_num_threads()}" if hf else ""
    print(f"(jax {jax.__version__}, {jax.devices()[0].platform}{threads}; medians of up to "
          f"{args.repeats} calls)")


if __name__ == "__main__":
    main()
