"""Bigram-key control for EAGLE-3 prefix caching: how much stale cached draft KV costs, on the embedded pair.

    python -m jaxserve.bench.bigram_control                                 # docstrings, 32 x 14 tok, 6 new
    python -m jaxserve.bench.bigram_control --source heldout --max-tokens 32 --new-tokens 6 20
    python -m jaxserve.bench.bigram_control --model-path DIR                # DIR/draft holds the EAGLE-3 head

The draft's KV at position i is computed from the embedding of token i + 1, so the prefix tree keys bigrams
in EAGLE mode. Switched to token keys (a test-only switch: the tree rebuilt empty in token mode), a cached
prefix carries draft KV computed with whatever token followed it in the request that wrote it.

Each prompt family is one prompt of up to `--max-tokens` tokens: first docstring lines of standard-library
callables (`--source docstrings`, text the embedded model was trained on) or the first tokens of held-out
corpus documents (`--source heldout`, `is_heldout(doc, 0.03)`, never trained on). Two fresh engines, one
with bigram keys and one with token keys, each run: for k = 1 .. len - 1, the prefixes `prompt[:k] + junk`
of every family (one batch per k, 3 greedy tokens each), then the full prompts (one batch, `--new-tokens`
greedy tokens, EOS ignored). With token keys, every cached position of a full prompt was written by the
request that put the junk token (or a generated one) after it: it is stale. With bigram keys none is.

Reported per configuration (one JSON line each, then a table):
  * top-1 agreement at the cached positions of the full prompts: the draft's prediction two tokens on,
    recorded when the slot's draft KV was written, against the target's own greedy choice there (an
    independent full-sequence forward of the target), pooled over positions, bigram vs token keys;
  * the paired per-family acc_length difference, bigram minus token: mean, standard error, and how many
    families have bigram > / = / < token. `all` is SGLang's acc_length (completion tokens / verify rounds);
    `R` restricts it to the first R verify rounds of the same runs (1 + mean drafts accepted in those
    rounds; the prefill's token is the same in both and left out).
Decoding is greedy, so each run is deterministic and the two engines emit the same tokens (lossless).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import string
import textwrap
from pathlib import Path

import numpy as np

from jaxserve.api import Engine
from jaxserve.assets import EMBEDDED_MODEL_DIR

GREEDY = {"temperature": 0}


def make_engine(model_path: str, draft_path: str, num_steps: int = 2) -> Engine:
    return Engine(model_path=model_path, speculative_algorithm="EAGLE3",
                  speculative_draft_model_path=draft_path, speculative_num_steps=num_steps,
                  max_total_tokens=8192, chunked_prefill_size=1024, max_running_requests=64,
                  speculative_policy="always")  # the control measures drafts: every decode step a round


def use_token_keys(engine: Engine) -> None:
    """The control's switch: an empty tree that keys tokens, not bigrams (before any request)."""
    from cache import RadixCache, SWARadixCache

    kv = engine.kv
    if kv.hybrid:
        kv.tree = SWARadixCache(kv.allocator, sliding_window=kv.tree.sliding_window, page_size=kv.page_size)
    else:
        kv.tree = RadixCache(kv.allocator, page_size=kv.page_size)


def docstring_families(tokenizer, count: int, max_tokens: int, min_tokens: int = 6) -> list[list[int]]:
    """First docstring lines of standard-library callables, as token ids (min_tokens .. max_tokens)."""
    out = []
    for module in (string, textwrap, inspect, os.path, np.lib.npyio if hasattr(np.lib, "npyio") else np):
        for name in sorted(dir(module)):
            doc = inspect.getdoc(getattr(module, name, None)) or ""
            line = doc.strip().split("\n")[0]
            ids = tokenizer.encode(line)
            if len(line.split()) >= 4 and len(ids) >= min_tokens:
                out.append(ids[:max_tokens])
            if len(out) == count:
                return out
    return out


def heldout_families(tokenizer, count: int, max_tokens: int, min_tokens: int = 6) -> list[list[int]]:
    """The first max_tokens tokens of held-out corpus documents (those with at least min_tokens)."""
    from jaxserve.training.corpus import build_documents, is_heldout

    out = []
    for doc in build_documents():
        if is_heldout(doc, 0.03):
            ids = tokenizer.encode(doc)
            if len(ids) >= min_tokens:
                out.append(ids[:max_tokens])
            if len(out) == count:
                break
    return out


def families(tokenizer, source: str, count: int, max_tokens: int, min_tokens: int = 6) -> list[list[int]]:
    make = {"docstrings": docstring_families, "heldout": heldout_families}[source]
    return make(tokenizer, count, max_tokens, min_tokens)


def target_greedy(model, prompts) -> list[np.ndarray]:
    """argmax of the target's logits at every position of each prompt: one full-sequence forward of all the
    prompts together (each its own page_size-1 pages), independent of the engine's cache."""
    from jaxserve.layers.attention_metadata import SequenceStep, build_attention_metadata
    from jaxserve.models.step import make_forward

    forward, params = make_forward(model)
    layout = model.kv_layout
    lengths = [len(p) for p in prompts]
    total = sum(lengths)
    pools = layout.make_pools(total, 1, np.float32)
    steps, start = [], 1
    for n in lengths:
        pages = list(range(start, start + n))
        steps.append(SequenceStep(n, n, pages, pages if layout.hybrid else None))
        start += n
    meta = build_attention_metadata(steps, page_size=1, with_swa=layout.hybrid, seq_buckets=(len(prompts),),
                                    token_buckets=(total,), page_buckets=(max(lengths),))
    tokens = np.zeros(meta.num_tokens, np.int32)
    tokens[:total] = np.concatenate([np.asarray(p, np.int32) for p in prompts])
    logits, _, _ = forward(params, tokens, meta, pools, return_all_logits=True)
    greedy = np.asarray(logits)[:total].argmax(-1)
    return np.split(greedy, np.cumsum(lengths)[:-1])


def run_families(engine: Engine, prompts, junk: list[int], greedy, new_tokens: int) -> dict:
    """Growing prefixes + junk (one batch per length), then the full prompts. Returns the draft top-1 hits
    and positions at the cached positions of the full prompts, and the full prompts' outputs."""
    from cache.keys import RadixKey

    engine.flush_cache()
    engine.stepper.record_draft_top1()
    for k in range(1, max(len(p) for p in prompts)):
        batch = [p[:k] + junk for p in prompts if k < len(p)]
        engine.generate(input_ids=batch, sampling_params={**GREEDY, "max_new_tokens": 3})
    tree = engine.kv.tree
    hits, positions = [], []
    for p, target in zip(prompts, greedy, strict=True):
        slots, _ = tree.match_prefix(RadixKey.of(p[:-1], bigram=tree.eagle))
        slots = np.asarray(slots[: len(p) - 2])  # the draft at i predicts token i + 2
        hits.append(int((engine.stepper.slot_top1[slots] == target[1: len(slots) + 1]).sum()))
        positions.append(len(slots))
    outs = engine.generate(input_ids=prompts, sampling_params={**GREEDY, "max_new_tokens": new_tokens,
                                                                "ignore_eos": True})
    return {"hits": hits, "positions": positions, "outs": outs}


def acc_length(out: dict, rounds: int | None = None) -> float:
    """SGLang's acc_length of one request (rounds None), or 1 + mean drafts accepted in its first `rounds`
    verify rounds."""
    meta = out["meta_info"]
    if rounds is None:
        return meta["completion_tokens"] / meta["spec_verify_ct"]
    return 1.0 + float(np.mean(meta["spec_accept_lengths"][:rounds]))


def paired(bigram: list[float], token: list[float]) -> dict:
    d = np.asarray(bigram) - np.asarray(token)
    return {"bigram": round(float(np.mean(bigram)), 4), "token": round(float(np.mean(token)), 4),
            "diff_mean": round(float(d.mean()), 4),
            "diff_se": round(float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else 0.0, 4),
            "wins": int((d > 0).sum()), "ties": int((d == 0).sum()), "losses": int((d < 0).sum())}


def control(bigram_engine: Engine, token_engine: Engine, prompts, new_tokens: int, rounds, junk) -> dict:
    greedy = target_greedy(bigram_engine.model, prompts)
    runs = {name: run_families(e, prompts, junk, greedy, new_tokens)
            for name, e in (("bigram", bigram_engine), ("token", token_engine))}
    b, t = runs["bigram"], runs["token"]
    same_outputs = [o["output_ids"] for o in b["outs"]] == [o["output_ids"] for o in t["outs"]]
    mean_len = round(float(np.mean([len(p) for p in prompts])), 2)
    row = {"families": len(prompts), "prompt_tokens_mean": mean_len,
           "new_tokens": new_tokens, "cached_positions": int(sum(b["positions"])),
           "agreement_bigram": round(sum(b["hits"]) / max(sum(b["positions"]), 1), 4),
           "agreement_token": round(sum(t["hits"]) / max(sum(t["positions"]), 1), 4),
           "identical_outputs": same_outputs, "acc_length": {}}
    for r in [*rounds, None]:
        key = "all" if r is None else str(r)
        row["acc_length"][key] = paired([acc_length(o, r) for o in b["outs"]],
                                        [acc_length(o, r) for o in t["outs"]])
    return row


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-path", default=str(EMBEDDED_MODEL_DIR))
    p.add_argument("--draft-path", default=None, help="default: <model-path>/draft")
    p.add_argument("--source", choices=("docstrings", "heldout"), default="docstrings")
    p.add_argument("--families", type=int, default=32)
    p.add_argument("--min-tokens", type=int, default=6, help="shorter prompts are skipped")
    p.add_argument("--max-tokens", type=int, nargs="+", default=[14], help="prompt length caps (tokens)")
    p.add_argument("--new-tokens", type=int, nargs="+", default=[6])
    p.add_argument("--rounds", type=int, nargs="+", default=[1, 2, 3],
                   help="acc_length also over the first R verify rounds")
    p.add_argument("--num-steps", type=int, default=2)
    p.add_argument("--junk", default=" xxx", help="text appended to each growing prefix")
    args = p.parse_args(argv)
    draft_path = args.draft_path or str(Path(args.model_path) / "draft")
    bigram = make_engine(args.model_path, draft_path, args.num_steps)
    token = make_engine(args.model_path, draft_path, args.num_steps)
    use_token_keys(token)
    junk = bigram.tokenizer.encode(args.junk)
    results = {}
    for cap in args.max_tokens:
        prompts = families(bigram.tokenizer, args.source, args.families, cap, args.min_tokens)
        for n in args.new_tokens:
            row = {"source": args.source, "max_tokens": cap, **control(bigram, token, prompts, n, args.rounds,
                                                                        junk)}
            results[(args.source, cap, n)] = row
            print(json.dumps(row), flush=True)
    print(f"\n{'source':>10} {'cap':>4} {'new':>4} {'agree b/t':>13} {'rounds':>6} {'acc b/t':>13} "
          f"{'diff':>8} {'se':>7} {'>/=/<':>9}")
    for (source, cap, n), r in results.items():
        agree = f"{r['agreement_bigram']:.3f}/{r['agreement_token']:.3f}"
        for key, a in r["acc_length"].items():
            print(f"{source:>10} {cap:>4} {n:>4} {agree:>13} {key:>6} {a['bigram']:.3f}/{a['token']:.3f} "
                  f"{a['diff_mean']:>+8.3f} {a['diff_se']:>7.3f} {a['wins']:>3}/{a['ties']}/{a['losses']}")
    return results


if __name__ == "__main__":
    main()
