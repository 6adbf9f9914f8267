"""End-to-end EAGLE-3 greedy decode of a random-weight gpt-oss-20b-shaped model, per attention backend.

    python -m jaxserve.bench.gpt_oss_e2e          # native vs the platform's kernel
    python -m jaxserve.bench.gpt_oss_e2e --tiny   # the embedded model's shapes (on a CPU: interpret mode)

Model (`--layers`, default 4): gpt-oss-20b's shapes (hidden 2880; 64 query / 8 KV heads of 64; sliding
window 128 on even layers, full attention on odd ones; sinks; 32 experts, top 4, expert width 2880; vocab
201,088; YaRN rope; bf16) with random weights, and a random EAGLE-3 head of the published gpt-oss-20b head's
shapes (hidden 2880, MLP 17,280, draft vocabulary 32,000) reading target layers (0, L/2, L-1). `--tiny`: the
embedded checkpoint's and its head's shapes (hidden 128, float32), same layer pattern, still random. One
seed for every backend, so every backend serves the same weights.

Run per backend: an engine (page size 16, radix cache on, EAGLE-3 chains of 3 drafts) generates 32 greedy
tokens for 8 random prompts of 512 tokens (`--tiny`: 4 tokens for 2 prompts of 40) twice: the first run
compiles and fills the radix cache, the second is timed, its prompts found in the cache, so it is mostly
decode. `tokens/s`: generated tokens of the timed run over its wall time; `accept`: mean drafts accepted
per verify round (a random head accepts about none: this measures the speculative path's cost, not its
gain); `tokens`: whether the backend's greedy tokens equal `native`'s, else where they first differ (bf16
weights can break a near-tie the other way; float32 `--tiny` runs must be equal).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from typing import Any

import jax
import numpy as np

from jaxserve.assets import EMBEDDED_DRAFT_DIR, EMBEDDED_MODEL_DIR

GPT_OSS_20B = dict(hidden_size=2880, intermediate_size=2880, num_attention_heads=64, num_key_value_heads=8,
                   head_dim=64, vocab_size=201088, sliding_window=128, num_local_experts=32,
                   num_experts_per_tok=4, swiglu_limit=7.0, dtype="bfloat16")
GPT_OSS_20B_HEAD = dict(hidden_size=2880, intermediate_size=17280, num_attention_heads=64,
                        num_key_value_heads=8, head_dim=64, vocab_size=201088, draft_vocab_size=32000,
                        torch_dtype="bfloat16")


TINY_SIZES = dict(batch=2, prompt_len=40, new_tokens=4, chunk=32)


@dataclasses.dataclass(frozen=True)
class Result:
    """One backend's timed run: outputs (token ids per request), seconds, tokens/s, mean accepted drafts."""

    backend: str
    outputs: list[list[int]]
    seconds: float
    tokens_per_s: float
    accept: float


def configs(num_layers: int, tiny: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """(target config.json dict, EAGLE-3 head config.json dict) of the benchmark's model."""
    target = json.loads((EMBEDDED_MODEL_DIR / "config.json").read_text())
    head = json.loads((EMBEDDED_DRAFT_DIR / "config.json").read_text())
    if not tiny:
        target, head = {**target, **GPT_OSS_20B}, {**head, **GPT_OSS_20B_HEAD}
    layer_types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)]
    target = {**target, "num_hidden_layers": num_layers, "layer_types": layer_types}
    aux = sorted({0, num_layers // 2, num_layers - 1})
    head = {**head, "eagle_config": {**head["eagle_config"], "eagle_aux_hidden_state_layer_ids": aux}}
    return target, head


def build(backend: str, target_raw: dict, head_raw: dict, seed: int = 0):
    """(model, draft) with random weights from `seed`, both attending on `backend`."""
    from jaxserve.models.build import random_model
    from jaxserve.models.config import ModelConfig
    from jaxserve.speculative.eagle3_draft import Eagle3Config, random_draft
    from jaxserve.speculative.vocab_map import build_vocab_map

    head = Eagle3Config.from_dict(head_raw)
    model = random_model(ModelConfig.from_dict(target_raw), seed=seed, backend=backend,
                         aux_hidden_state_layer_ids=head.aux_layer_ids)
    vocab_map = None
    if head.draft_vocab_size:
        counts = np.random.default_rng(seed).integers(0, 1000, head.vocab_size)
        vocab_map = build_vocab_map(counts, head.draft_vocab_size)
    return model, random_draft(head, seed=seed, backend=backend, vocab_map=vocab_map)


def run(backend: str, target_raw: dict, head_raw: dict, prompts: list[list[int]], *, new_tokens: int,
        steps: int, page_size: int = 16, chunk: int = 512) -> Result:
    """Build the model on `backend`, generate twice (compile + fill the cache, then timed); see the module
    docstring."""
    from jaxserve.api import Engine
    from jaxserve.engine.step_input import Buckets

    model, draft = build(backend, target_raw, head_raw)
    batch, longest = len(prompts), max(map(len, prompts)) + new_tokens + steps + 1
    pages = -(-longest // page_size) + 1  # one more page: a verify round runs past the last position
    buckets = Buckets(tuple(sorted({16, min(64, chunk), chunk})), (batch,), (pages,))
    engine = Engine(model=model, draft_model=draft, speculative_algorithm="EAGLE3",
                    speculative_num_steps=steps, page_size=page_size, context_length=longest,
                    max_total_tokens=2 * batch * pages * page_size, chunked_prefill_size=chunk,
                    max_running_requests=batch, buckets=buckets)
    params = {"temperature": 0.0, "max_new_tokens": new_tokens, "ignore_eos": True}
    engine.generate(input_ids=prompts, sampling_params=params)
    start = time.perf_counter()
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    seconds = time.perf_counter() - start
    _release(engine.model, model, draft)
    accepted = np.concatenate([o["meta_info"]["spec_accept_lengths"] for o in outs])
    return Result(backend, [o["output_ids"] for o in outs], seconds, batch * new_tokens / seconds,
                  float(accepted.mean()) if accepted.size else 0.0)


def _release(*modules) -> None:
    """Free the modules' device buffers now: the next backend's model must not share the device with this
    one, and the parameters stay reachable after the engine is dropped (measured, cause not traced)."""
    from flax import nnx

    for module in modules:
        for leaf in jax.tree.leaves(nnx.state(module)):
            if isinstance(leaf, jax.Array) and not leaf.is_deleted():
                leaf.delete()


def agreement(got: list[list[int]], want: list[list[int]]) -> str:
    """'equal', or where the first request that differs first differs."""
    for r, (g, w) in enumerate(zip(got, want, strict=True)):
        if g != w:
            k = next((i for i, (a, b) in enumerate(zip(g, w, strict=False)) if a != b), min(len(g), len(w)))
            return f"differ: request {r}, token {k}"
    return "equal"


def bench(backends: list[str], *, num_layers: int = 4, tiny: bool = False, batch: int = 8,
          prompt_len: int = 512, new_tokens: int = 32, steps: int = 3, chunk: int = 512,
          seed: int = 0) -> list[tuple[Result, str]]:
    """Run `native` and then each of `backends`; print and return (result, agreement with native) per
    backend, native first."""
    target_raw, head_raw = configs(num_layers, tiny)
    rng = np.random.RandomState(seed)
    prompts = rng.randint(1, target_raw["vocab_size"], size=(batch, prompt_len)).tolist()
    shape = f"{'embedded model' if tiny else 'gpt-oss-20b'} shapes, {num_layers} layers"
    print(f"end-to-end: {shape}, batch {batch} x {prompt_len}-token prompts, {new_tokens} new tokens, "
          f"EAGLE-3 chains of {steps}")
    print(f"{'backend':<11} {'tokens/s':>9} {'x native':>9} {'accept':>7}  tokens")
    results = []
    for name in ["native", *[b for b in backends if b != "native"]]:
        result = run(name, target_raw, head_raw, prompts, new_tokens=new_tokens, steps=steps, chunk=chunk)
        native = results[0][0] if results else result
        agree = agreement(result.outputs, native.outputs)
        results.append((result, agree))
        print(f"{name:<11} {result.tokens_per_s:>9.1f} {result.tokens_per_s / native.tokens_per_s:>9.2f} "
              f"{result.accept:>7.2f}  {agree}", flush=True)
    return results


def main(argv: list[str] | None = None) -> None:
    from jaxserve.bench.attention import KERNEL_BY_PLATFORM

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="the embedded model's shapes, few tokens")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--backends", nargs="+", default=None,
                        help="default: the platform's kernel (on a CPU both, in interpret mode)")
    args = parser.parse_args(argv)
    kernel = KERNEL_BY_PLATFORM.get(jax.default_backend())
    backends = args.backends or ([kernel] if kernel else ["pallas_tpu", "pallas_gpu"])
    bench(backends, num_layers=args.layers, tiny=args.tiny, **(TINY_SIZES if args.tiny else {}))


if __name__ == "__main__":
    main()
