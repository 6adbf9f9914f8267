"""The seed scenario and its control, on the shipped (target, EAGLE-3 head) pair.

Seed: prompts "You xxx", "You are xxx", ..., "You are a helpful, respectful and honest assistant xxx" (3 new
tokens each) fill the prefix tree, then "You are a helpful, respectful and honest assistant." decodes 20
tokens. With bigram keys, the cached prefix carries draft KV computed with the true next token, so the
acc_length equals the one without the radix cache (and is > 1: the head is trained).

Control (test-only switch: the tree rebuilt with token keys): each cached position's draft KV was written by
the request that ended in the junk token there, so it was computed with the wrong next token. Over >= 30
prompt families (growing prefixes ending in junk, then the full prompt) the draft's top-1 at the cached
positions (its prediction two tokens on, recorded when the slot's draft KV was written) agrees less with the
target, and the paired acc_length is lower, than with bigram keys. Agreement is with the target's own greedy
choice there (from an independent full-sequence forward of the target): what acceptance depends on.
The full prompts decode 6 tokens: the stale KV hurts the rounds right after the prefix; measured on the
shipped pair, agreement 0.381 (bigram) vs 0.031 (token keys), acc_length 2.157 vs 2.065 over 6 tokens, but
2.051 vs 2.071 over 20 tokens (later rounds attend mostly to fresh KV and the difference is noise).

Runs against `jaxserve.assets.EMBEDDED_MODEL_DIR` (or the directory in JAXSERVE_SPEC_PAIR_DIR, with the head
in its `draft/`).
"""

from __future__ import annotations

import inspect
import os
import string
import textwrap
from pathlib import Path

import numpy as np

from jaxserve.assets import EMBEDDED_MODEL_DIR
from jaxserve.engine import Engine

PAIR_DIR = Path(os.environ.get("JAXSERVE_SPEC_PAIR_DIR", EMBEDDED_MODEL_DIR))

SEED = "You are a helpful, respectful and honest assistant"
GREEDY = {"temperature": 0}


def make_engine(**kwargs) -> Engine:
    return Engine(model_path=str(PAIR_DIR), speculative_algorithm="EAGLE3",
                  speculative_draft_model_path=str(PAIR_DIR / "draft"), speculative_num_steps=2,
                  max_total_tokens=8192, chunked_prefill_size=1024, max_running_requests=32, **kwargs)


def use_token_keys(engine: Engine) -> None:
    """The control's switch: an empty tree that keys tokens, not bigrams (before any request)."""
    from cache import RadixCache, SWARadixCache

    kv = engine.kv
    if kv.hybrid:
        kv.tree = SWARadixCache(kv.allocator, sliding_window=kv.tree.sliding_window, page_size=kv.page_size)
    else:
        kv.tree = RadixCache(kv.allocator, page_size=kv.page_size)


def test_seed_scenario_acc_length_same_with_and_without_radix_cache():
    words = SEED.split()
    acc = {}
    for no_radix in (False, True):
        engine = make_engine(disable_radix_cache=no_radix)
        for k in range(1, len(words) + 1):
            engine.generate(" ".join(words[:k]) + " xxx", {**GREEDY, "max_new_tokens": 3})
        # ignore_eos: the embedded model ends a document after "assistant." at once; decode all 20 tokens
        out = engine.generate(SEED + ".", {**GREEDY, "max_new_tokens": 20, "ignore_eos": True})
        assert (out["meta_info"]["cached_tokens"] > 0) != no_radix
        acc[no_radix] = (out["meta_info"]["spec_accept_length"], out["output_ids"])
        engine.flush_cache()
    print(f"seed scenario acc_length: radix {acc[False][0]:.3f}, no radix {acc[True][0]:.3f}")
    assert acc[False][1] == acc[True][1]
    assert acc[False][0] == acc[True][0] > 1


def _families(tokenizer, count: int = 32, max_tokens: int = 14) -> list[list[int]]:
    """First docstring lines of standard-library callables, as token ids (6 .. max_tokens tokens)."""
    out = []
    for module in (string, textwrap, inspect, os.path, np.lib.npyio if hasattr(np.lib, "npyio") else np):
        for name in sorted(dir(module)):
            doc = inspect.getdoc(getattr(module, name, None)) or ""
            line = doc.strip().split("\n")[0]
            ids = tokenizer.encode(line)
            if len(line.split()) >= 4 and len(ids) >= 6:
                out.append(ids[:max_tokens])
            if len(out) == count:
                return out
    return out


def _target_greedy(engine: Engine, families) -> list[np.ndarray]:
    """argmax of the target's logits at every position of each prompt (one full forward each)."""
    from tests.models.helpers import Runner, full_logits

    runner = Runner(engine.model)
    return [full_logits(runner, f)[0].argmax(-1) for f in families]


def _run_families(engine: Engine, families, junk: list[int], greedy) -> tuple[float, float]:
    """Growing prefixes + junk (one batch per length), then the full prompts: returns the draft top-1
    agreement with the target's greedy choice at the cached positions of the full prompts, and their pooled
    acc_length."""
    engine.spec.record_draft_top1()
    for k in range(1, max(len(f) for f in families)):
        batch = [f[:k] + junk for f in families if k < len(f)]
        engine.generate(input_ids=batch, sampling_params={**GREEDY, "max_new_tokens": 3})
    hits, total, from_cache = 0, 0, 0
    tree = engine.kv.tree
    for f, target in zip(families, greedy, strict=True):
        from cache.keys import RadixKey

        slots, _ = tree.match_prefix(RadixKey.of(f[:-1], bigram=tree.eagle))
        for i, slot in enumerate(slots[: len(f) - 2]):  # the draft at i predicts token i + 2
            hits += int(engine.spec.slot_top1[slot] == target[i + 1])
            total += 1
        from_cache += len(slots)
    outs = engine.generate(input_ids=families, sampling_params={**GREEDY, "max_new_tokens": 6,
                                                                "ignore_eos": True})
    assert sum(o["meta_info"]["cached_tokens"] for o in outs) > 0 and from_cache > 0
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    rounds = sum(o["meta_info"]["spec_verify_ct"] for o in outs)
    return hits / total, tokens / rounds


def test_control_token_keys_make_cached_draft_kv_stale():
    bigram = make_engine()
    families = _families(bigram.tokenizer)
    assert len(families) >= 30
    junk = bigram.tokenizer.encode(" xxx")
    greedy = _target_greedy(bigram, families)
    agree_bigram, acc_bigram = _run_families(bigram, families, junk, greedy)
    token = make_engine()
    use_token_keys(token)
    agree_token, acc_token = _run_families(token, families, junk, greedy)
    print(f"control over {len(families)} families: top-1 agreement at cached positions bigram "
          f"{agree_bigram:.3f} vs token {agree_token:.3f} (diff {agree_bigram - agree_token:+.3f}); "
          f"acc_length bigram {acc_bigram:.3f} vs token {acc_token:.3f} (diff {acc_bigram - acc_token:+.3f})")
    assert agree_token < agree_bigram
    assert acc_token < acc_bigram


def test_pooled_acc_length_on_held_out_prompts():
    """>= 30 held-out corpus documents (the training split's complement), their first 32 tokens as prompts,
    64 greedy tokens each with 2 steps (3 tokens verified per round): pooled acc_length >= 1.6."""
    from jaxserve.training.corpus import build_documents, is_heldout

    engine = make_engine()
    docs = [d for d in build_documents() if is_heldout(d, 0.03)]
    prompts = [ids[:32] for ids in (engine.tokenizer.encode(d) for d in docs) if len(ids) >= 8][:32]
    assert len(prompts) >= 30
    outs = engine.generate(input_ids=prompts, sampling_params={**GREEDY, "max_new_tokens": 64,
                                                               "ignore_eos": True})
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    rounds = sum(o["meta_info"]["spec_verify_ct"] for o in outs)
    print(f"pooled acc_length over {len(prompts)} held-out prompts x 64 tokens: {tokens / rounds:.3f}")
    assert tokens / rounds >= 1.6
