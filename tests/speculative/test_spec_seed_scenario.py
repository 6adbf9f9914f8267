"""The seed scenario and its control, on the shipped (target, EAGLE-3 head) pair.

Seed: prompts "You xxx", "You are xxx", ..., "You are a helpful, respectful and honest assistant xxx" (3 new
tokens each) fill the prefix tree, then "You are a helpful, respectful and honest assistant." decodes 20
tokens (the shipped model continues the prompt by itself: no ignore_eos). With bigram keys, the cached
prefix carries draft KV computed with the true next token, so the acc_length equals the one without the
radix cache (and is > 1.3, the PR's 1.33 on gpt-oss-20b: the head is trained).

Control (test-only switch: the tree rebuilt with token keys, `jaxserve.bench.bigram_control`): each cached
position's draft KV was written by the request that ended in the junk token (or a generated one) there, so it
was computed with the wrong next token. Prompt families: growing prefixes `prompt[:k] + " xxx"` (3 new tokens
each, one batch per k), then the full prompts. Measured: the draft's top-1 at the cached positions of the full
prompts (its prediction two tokens on, recorded when the slot's draft KV was written) against the target's
own greedy choice there (independent full-sequence forward), and the paired per-family acc_length (completion
tokens / verify rounds), bigram minus token keys.

Exploration (32 first docstring lines of stdlib callables, the set this test used before; 6 new tokens;
diff = mean paired acc_length difference +- standard error, bigram > / = / < token families):
  cap 14 tokens (mean 13.3, 360 cached positions): agreement 0.381 vs 0.031; diff +0.031 +- 0.100
  (10/16/6); over 20 new tokens -0.045 +- 0.049 (8/15/9); first verify round only +0.250 +- 0.174 (7/21/4).
  No measurable acc_length effect.
  cap 24 tokens (mean 17.6, 499 positions): agreement 0.421 vs 0.030; diff +0.275 +- 0.084 (14/17/1); first
  round +0.781 +- 0.200 (16/12/4); over 20 new tokens +0.134 +- 0.048 (15/13/4).
Design fixed from that, before any confirmation run: longest stale prefixes, few new tokens. 32 held-out
corpus documents (`is_heldout(doc, 0.03)`, never trained on, disjoint from the docstring families), the first
32 with >= 32 tokens, their first 32 tokens as prompts (30 cached positions each); 6 new tokens; primary
statistic the paired per-family acc_length difference (confirmed if > 0 and > 2 standard errors), secondary
the pooled agreement.
Confirmation (960 cached positions): agreement 0.543 (bigram) vs 0.026 (token keys); acc_length 2.028 vs
1.859, diff +0.169 +- 0.077 (10/19/3); first round +0.312 +- 0.158 (10/19/3), first 3 rounds +0.286 +- 0.087
(16/12/4). Over 20 new tokens it fades: +0.152 +- 0.062 (19/8/5) here, and on the docstring families from
+0.275 to +0.134 (cap 24) or to noise (cap 14): later rounds attend mostly to fresh KV.
Those figures are from the pair trained on docstrings alone. On the pair retrained with English prose and
packed documents (same families, same design): agreement 0.399 vs 0.027; acc_length 2.528 vs 2.112, diff
+0.416 +- 0.124 (14/15/3); first round +0.406 +- 0.148; so the test now asks for a difference above two
standard errors.
This test runs the confirmed design and asserts agreement and the paired mean acc_length difference.

Runs against `jaxserve.assets.EMBEDDED_MODEL_DIR` (or the directory in JAXSERVE_SPEC_PAIR_DIR, with the head
in its `draft/`).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from jaxserve.api import Engine
from jaxserve.assets import EMBEDDED_MODEL_DIR

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

PAIR_DIR = Path(os.environ.get("JAXSERVE_SPEC_PAIR_DIR", EMBEDDED_MODEL_DIR))

SEED = "You are a helpful, respectful and honest assistant"
GREEDY = {"temperature": 0}


def make_engine(**kwargs) -> Engine:
    return Engine(model_path=str(PAIR_DIR), speculative_algorithm="EAGLE3",
                  speculative_draft_model_path=str(PAIR_DIR / "draft"), speculative_num_steps=2,
                  max_total_tokens=8192, chunked_prefill_size=1024, max_running_requests=32,
                  speculative_policy="always", **kwargs)


def test_seed_scenario_acc_length_same_with_and_without_radix_cache():
    words = SEED.split()
    acc = {}
    for no_radix in (False, True):
        engine = make_engine(disable_radix_cache=no_radix)
        for k in range(1, len(words) + 1):
            engine.generate(" ".join(words[:k]) + " xxx", {**GREEDY, "max_new_tokens": 3})
        out = engine.generate(SEED + ".", {**GREEDY, "max_new_tokens": 20})  # the model continues by itself
        assert (out["meta_info"]["cached_tokens"] > 0) != no_radix
        assert out["meta_info"]["completion_tokens"] == 20
        acc[no_radix] = (out["meta_info"]["spec_accept_length"], out["output_ids"])
        engine.flush_cache()
    print(f"seed scenario acc_length: radix {acc[False][0]:.3f}, no radix {acc[True][0]:.3f}")
    assert acc[False][1] == acc[True][1]
    assert acc[False][0] == acc[True][0] > 1.3


def test_control_token_keys_make_cached_draft_kv_stale():
    from jaxserve.bench.bigram_control import control, heldout_families, use_token_keys
    from jaxserve.bench.bigram_control import make_engine as bench_engine

    bigram = bench_engine(str(PAIR_DIR), str(PAIR_DIR / "draft"))
    token = bench_engine(str(PAIR_DIR), str(PAIR_DIR / "draft"))
    use_token_keys(token)
    prompts = heldout_families(bigram.tokenizer, count=32, max_tokens=32, min_tokens=32)
    assert len(prompts) >= 30
    r = control(bigram, token, prompts, new_tokens=6, rounds=[1], junk=bigram.tokenizer.encode(" xxx"))
    acc, first = r["acc_length"]["all"], r["acc_length"]["1"]
    print(f"control over {r['families']} held-out families x {r['cached_positions']} cached positions: top-1 "
          f"agreement bigram {r['agreement_bigram']:.3f} vs token {r['agreement_token']:.3f}; acc_length "
          f"(6 new tokens) bigram {acc['bigram']:.3f} vs token {acc['token']:.3f}, paired diff "
          f"{acc['diff_mean']:+.3f} +- {acc['diff_se']:.3f} (bigram >/=/< token: {acc['wins']}/{acc['ties']}/"
          f"{acc['losses']}); first round {first['diff_mean']:+.3f} +- {first['diff_se']:.3f}")
    assert r["identical_outputs"]  # greedy speculative decoding is lossless whatever the draft KV
    assert r["cached_positions"] >= 30 * len(prompts)
    assert r["agreement_token"] < r["agreement_bigram"]
    assert acc["diff_mean"] > 2 * acc["diff_se"] > 0  # the confirmation criterion, not just a positive sign


def test_pooled_acc_length_on_held_out_prompts():
    """>= 30 held-out corpus documents (the training split's complement), their first 32 tokens as prompts,
    64 greedy tokens each with 2 steps (3 tokens verified per round): pooled acc_length >= 2.0 (2.30 measured
    on the shipped pair; the pair trained on docstrings alone gave >= 1.6)."""
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
    assert tokens / rounds >= 2.0


def test_auto_policy_keeps_rounds_after_a_poorly_drafted_priming_request():
    """At batch 1 `speculative_policy="auto"` judges the decoding request's own acceptance: a priming
    request the draft cannot predict (random ids: no draft accepted) must not turn rounds off for the seed
    scenario after it (judging from all rounds so far, it fell to acc_length 1.05 with 61 plain steps)."""
    engine = make_engine()
    engine.stepper.set_policy("auto")
    priming = np.random.RandomState(0).randint(1, 1000, size=24).tolist()
    engine.generate(input_ids=priming, sampling_params={**GREEDY, "max_new_tokens": 16})
    assert engine.stepper.accept_rate < 0.1
    words = SEED.split()
    for k in range(1, len(words) + 1):
        engine.generate(" ".join(words[:k]) + " xxx", {**GREEDY, "max_new_tokens": 3})
    out = engine.generate(SEED + ".", {**GREEDY, "max_new_tokens": 20})
    assert out["meta_info"]["completion_tokens"] == 20
    assert out["meta_info"]["spec_accept_length"] > 1.3
