"""Greedy speculative decoding (EAGLE-3 chain drafting) in the engine is lossless: its output equals the plain
engine's greedy output token for token, with the radix cache on and off, at page sizes 1 and 16, for a
full-attention (Llama) and a hybrid sliding-window (gpt-oss) target; and it leaks no KV."""

from __future__ import annotations

import numpy as np
import pytest

from tests.speculative import spec_pairs as sp

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

GREEDY = {"temperature": 0}


def _reference(kind: str, prompts, max_new: list[int]) -> list[list[int]]:
    params = [{**GREEDY, "max_new_tokens": m} for m in max_new]
    outs = sp.plain_outputs(kind, prompts, params, disable_radix_cache=True)
    return [o["output_ids"] for o in outs]


def _run_in_waves(engine, prompts, max_new):
    """First half, then second half (which then finds the first half's prefixes in the tree)."""
    half = len(prompts) // 2
    params = [{**GREEDY, "max_new_tokens": m} for m in max_new]
    return engine.generate(input_ids=prompts[:half], sampling_params=params[:half]) + \
        engine.generate(input_ids=prompts[half:], sampling_params=params[half:])


CASES = [("llama", 1, False), ("llama", 1, True), ("llama", 16, False), ("llama", 16, True),
         ("gpt_oss", 1, False), ("gpt_oss", 16, False)]


@pytest.mark.parametrize(("kind", "page_size", "no_radix"), CASES)
def test_greedy_output_equals_plain_greedy(kind, page_size, no_radix):
    prompts = sp.shared_prefix_prompts(seed=page_size + 7 * no_radix, n=8)
    max_new = [1, 2, 5, 9, 24, 17, 30, 3]
    ref = _reference(kind, prompts, max_new)
    engine = sp.engine(kind, page_size=page_size, disable_radix_cache=no_radix)
    outs = _run_in_waves(engine, prompts, max_new)
    assert [o["output_ids"] for o in outs] == ref
    cached = sum(o["meta_info"]["cached_tokens"] for o in outs[4:])
    assert (cached == 0) if no_radix else (cached > 0)
    for out, m in zip(outs, max_new, strict=True):
        info = out["meta_info"]
        assert info["completion_tokens"] == len(out["output_ids"]) <= m
        rounds = info["spec_verify_ct"]
        assert rounds == len(info["spec_accept_lengths"]) == sum(info["spec_accept_histogram"])
        # every round yields its accepted drafts + 1 token, except that the last may be cut by max_new_tokens
        produced = 1 + sum(a + 1 for a in info["spec_accept_lengths"])
        assert produced >= info["completion_tokens"] > produced - (engine.args.speculative_num_steps + 1)
        assert info["spec_accept_length"] == pytest.approx(info["completion_tokens"] / max(rounds, 1))
    engine.check_memory()
    assert (engine.kv.tree_slots() == 0) if no_radix else (engine.kv.tree_slots() > 0)
    engine.flush_cache()  # raises on a leak: every slot must be back once the tree is dropped


def test_copy_draft_accepts_a_mix_and_random_draft_is_still_lossless():
    prompts = sp.shared_prefix_prompts(seed=11, n=6)
    max_new = [32] * 6
    ref = _reference("llama", prompts, max_new)
    for which in ("copy", "random"):
        engine = sp.engine("llama", which=which)
        outs = engine.generate(input_ids=prompts, sampling_params=[{**GREEDY, "max_new_tokens": 32}] * 6)
        assert [o["output_ids"] for o in outs] == ref
        accepted = np.concatenate([o["meta_info"]["spec_accept_lengths"] for o in outs])
        if which == "copy":  # full rounds and rejections both occur, so both accept paths ran
            assert (accepted == 3).any() and (accepted == 0).any() and engine.stepper.acc_length > 1.3
        else:
            assert engine.stepper.acc_length < 1.2
        engine.flush_cache()


@pytest.mark.parametrize("num_steps", [1, 2, 5])
def test_chain_lengths(num_steps):
    prompts = sp.shared_prefix_prompts(seed=3, n=4)
    ref = _reference("llama", prompts, [20] * 4)
    engine = sp.engine("llama", num_steps=num_steps)
    outs = engine.generate(input_ids=prompts, sampling_params={**GREEDY, "max_new_tokens": 20})
    assert [o["output_ids"] for o in outs] == ref
    assert max(max(o["meta_info"]["spec_accept_lengths"]) for o in outs) <= num_steps
    engine.flush_cache()


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_greedy_with_penalties_equals_plain(tree):
    """Penalised greedy requests (frequency, presence, repetition; mixed with plain ones in one batch) give
    the plain engine's output: verification penalises each position with the tokens drafted before it."""
    prompts = sp.shared_prefix_prompts(seed=5, n=6)
    params = [{**GREEDY, "max_new_tokens": 40},
              {**GREEDY, "max_new_tokens": 40, "frequency_penalty": 1.5},
              {**GREEDY, "max_new_tokens": 40, "presence_penalty": 1.0},
              {**GREEDY, "max_new_tokens": 40, "repetition_penalty": 1.8},
              {**GREEDY, "max_new_tokens": 40, "frequency_penalty": 0.7, "presence_penalty": 0.3},
              {**GREEDY, "max_new_tokens": 40}]
    plain = sp.plain_outputs("llama", prompts, params)
    unpenalised = sp.plain_outputs("llama", prompts, [{**GREEDY, "max_new_tokens": 40}] * 6)
    # the penalties change the outputs (else this test could not fail)
    assert all(plain[i]["output_ids"] != unpenalised[i]["output_ids"] for i in (1, 2, 3, 4))
    extra = dict(speculative_eagle_topk=2, speculative_num_draft_tokens=4) if tree else {}
    engine = sp.engine("llama", num_steps=2 if tree else 3, **extra)
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in plain]
    assert max(max(o["meta_info"]["spec_accept_lengths"]) for o in outs) > 0
    engine.check_memory()
    engine.flush_cache()


@pytest.mark.parametrize("drafting", ["chain", "tree"])
def test_overlapped_schedule_matches_the_synchronous_one(drafting):
    """The overlapped schedule (round t+1 dispatched before round t's verdict is read, its starts, last
    tokens and output counts taken from that verdict on device) decides exactly what the synchronous one
    decides, for chains and trees: same tokens for greedy, seeded sampled and penalised requests, same
    accepted lengths; overlapped, rounds really are dispatched while another is in flight."""
    prompts = sp.shared_prefix_prompts(seed=13, n=6)
    params = [{**GREEDY, "max_new_tokens": 30},
              {"temperature": 0.9, "top_p": 0.9, "max_new_tokens": 30, "seed": 3},
              {"temperature": 1.2, "top_k": 5, "max_new_tokens": 17, "seed": 4},
              {**GREEDY, "max_new_tokens": 25, "frequency_penalty": 1.1},
              {"temperature": 0.7, "presence_penalty": 0.8, "max_new_tokens": 30, "seed": 5},
              {**GREEDY, "max_new_tokens": 9}]
    extra = dict(speculative_eagle_topk=3, speculative_num_draft_tokens=6) if drafting == "tree" else {}
    outs = {}
    for sync in (True, False):
        engine = sp.engine("llama", num_steps=3, disable_overlap_schedule=sync, **extra)
        rids = [engine.submit(input_ids=p, sampling_params=q) for p, q in zip(prompts, params, strict=True)]
        overlapped = 0  # decode steps that left a round in flight
        while not engine.idle:
            engine.step()
            overlapped += engine.stepper.inflight is not None
        outs[sync] = [engine.output(r) for r in rids]
        assert (overlapped == 0) == sync, overlapped
        engine.check_memory()
        engine.flush_cache()
    for a, b in zip(outs[True], outs[False], strict=True):
        assert a["output_ids"] == b["output_ids"]
        assert a["meta_info"]["spec_accept_lengths"] == b["meta_info"]["spec_accept_lengths"]
    assert any(max(o["meta_info"]["spec_accept_lengths"]) > 0 for o in outs[False])
