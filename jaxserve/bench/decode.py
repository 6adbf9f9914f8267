"""Decode throughput benchmark: the plain engine against Hugging Face transformers, same run, same tokens.

    python -m jaxserve.bench.decode                          # batch 1, 8, 32; 64 new tokens
    python -m jaxserve.bench.decode --batch-sizes 1 8 --no-compile
    python -m jaxserve.bench.decode --backends native xla    # one engine per attention backend

Workload: B prompts of `--prompt-len` seeded random token ids decode `--output-len` new tokens greedily,
EOS ignored, on the embedded checkpoint (float32). Contenders, each measured as output tokens over the wall
time of one whole batched generate call (the prompts' prefill included, for all alike):
- `jaxserve[backend]`: `Engine` with speculative decoding off, radix cache flushed before every pass;
- `hf eager`: `model.generate` with transformers' default dynamic cache, eager attention and the experts'
  eager loop over the experts a batch hits (on CPU the fastest of transformers' experts implementations
  for this model, ahead of the grouped and the per-token batched matmul);
- `hf static+compile`: `cache_implementation="static"` and transformers' own compile path (`CompileConfig`):
  the decode forward runs under `torch.compile` with fixed-size attention masks, `fullgraph=True` so no
  part of it silently falls back to eager, and the experts' grouped matmul (static shapes; the eager loop
  is data-dependent and breaks the graph). `dynamic=None`: the sliding-window cache layers keep their fill
  level as a Python int, which a static compile specialises on, recompiling every step; after one
  recompile dynamo treats it as symbolic. Skipped with `--no-compile` (compiling takes minutes on CPU).
Every contender first runs the batch once untimed (compiles, warms), then `--repeats` timed passes in ABBA
order; the median pass is reported. `agree` is the fraction of generated tokens equal to the first
contender's (float32 greedy decoding of two implementations may part at a near tie; it is reported, not
hidden). Ratios: jaxserve tokens/s over each HF contender's. Compare ratios across machines, not times.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import numpy as np

from jaxserve.assets import EMBEDDED_MODEL_DIR

Generate = Callable[[np.ndarray], np.ndarray]  # prompts [B, P] -> generated ids [B, output_len]


def prompt_ids(batch: int, prompt_len: int, vocab: int, seed: int = 0) -> np.ndarray:
    return np.random.RandomState(seed).randint(1, vocab, size=(batch, prompt_len)).astype(np.int64)


def jaxserve_generate(backend: str, max_batch: int, prompt_len: int, output_len: int) -> Generate:
    from jaxserve import Engine

    engine = Engine(attention_backend=backend, max_running_requests=max_batch,
                    max_total_tokens=max(4096, 2 * max_batch * (prompt_len + output_len)),
                    chunked_prefill_size=max(2048, max_batch * prompt_len))
    params = {"temperature": 0.0, "max_new_tokens": output_len, "ignore_eos": True}

    def run(prompts: np.ndarray) -> np.ndarray:
        engine.flush_cache()
        outs = engine.generate(input_ids=[p.tolist() for p in prompts], sampling_params=params)
        return np.array([o["output_ids"] for o in outs])

    return run


def hf_generate(static_compile: bool, output_len: int, num_threads: int | None) -> Generate:
    import torch
    from transformers import AutoModelForCausalLM, CompileConfig

    if num_threads is not None:
        torch.set_num_threads(num_threads)
    model = AutoModelForCausalLM.from_pretrained(EMBEDDED_MODEL_DIR, attn_implementation="eager",
                                                 dtype=torch.float32, local_files_only=True).eval()
    # the experts' Python loop over the hit experts is the fastest eager path, but it is data-dependent:
    # compiled, the forward uses the sorted grouped matmul, which has static shapes
    model.set_experts_implementation("grouped_mm" if static_compile else "eager")
    kwargs = dict(max_new_tokens=output_len, min_new_tokens=output_len, do_sample=False, top_p=None,
                  top_k=None, temperature=None, pad_token_id=0)
    if static_compile:
        kwargs["cache_implementation"] = "static"
        # transformers compiles only on accelerators unless told otherwise; "default" mode because
        # "reduce-overhead" means CUDA graphs
        config = CompileConfig(fullgraph=True, dynamic=None, mode="default")
        config._compile_all_devices = True  # a class attribute, not a constructor argument
        kwargs["compile_config"] = config

    def run(prompts: np.ndarray) -> np.ndarray:
        ids = torch.tensor(prompts, dtype=torch.long)
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
        return out[:, prompts.shape[1]:].numpy()

    return run


def measure(contenders: dict[str, Generate], prompts: np.ndarray, repeats: int) -> tuple[dict, dict]:
    """Median seconds per pass (one untimed pass first, then ABBA) and each contender's agreement with the
    first contender's tokens (fraction of equal generated tokens)."""
    tokens = {name: gen(prompts) for name, gen in contenders.items()}
    first = next(iter(tokens.values()))
    agree = {name: float((t == first).mean()) for name, t in tokens.items()}
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    order = list(contenders)
    for r in range(repeats):
        for name in order if r % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            contenders[name](prompts)
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(s) for name, s in samples.items()}, agree


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--backends", nargs="+", default=["xla"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-compile", action="store_true", help="skip HF static cache + torch.compile")
    parser.add_argument("--torch-threads", type=int, default=None)
    args = parser.parse_args(argv)

    contenders: dict[str, Generate] = {
        f"jaxserve[{b}]": jaxserve_generate(b, max(args.batch_sizes), args.prompt_len, args.output_len)
        for b in args.backends}
    contenders["hf eager"] = hf_generate(False, args.output_len, args.torch_threads)
    if not args.no_compile:
        contenders["hf static+compile"] = hf_generate(True, args.output_len, args.torch_threads)
    vocab = json.loads((EMBEDDED_MODEL_DIR / "config.json").read_text())["vocab_size"]
    ours = [n for n in contenders if n.startswith("jaxserve")]
    theirs = [n for n in contenders if n.startswith("hf")]
    header = ["batch", *(f"{n} tok/s" for n in contenders), *(f"{o} / {t}" for o in ours for t in theirs),
              *(f"agree {n}" for n in list(contenders)[1:])]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header), flush=True)
    for batch in args.batch_sizes:
        prompts = prompt_ids(batch, args.prompt_len, vocab)
        medians, agree = measure(contenders, prompts, args.repeats)
        rate = {n: batch * args.output_len / s for n, s in medians.items()}
        cells = [str(batch), *(f"{rate[n]:,.0f}" for n in contenders)]
        cells += [f"{rate[o] / rate[t]:.2f}x" for o in ours for t in theirs]
        cells += [f"{agree[n]:.3f}" for n in list(contenders)[1:]]
        print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
