"""Rejection sampling keeps the target's distribution: sampled speculative outputs (temperature 1, top-k 3,
so 27 possible 3-token continuations) are distributed as the target's own token-by-token distribution,
computed independently from full-sequence forwards of the target (chi-square test), with chain drafting and
with tree drafting; and the rounds both accept and reject drafts, so both branches are exercised. (The walk
itself is checked against brute force in test_spec_verify_walk.py.)"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from tests.models.helpers import Runner, full_logits
from tests.speculative import spec_pairs as sp

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

TEMPERATURE, TOP_K, NEW = 1.0, 3, 3


def _filtered_probs(logits_row: np.ndarray) -> dict[int, float]:
    top = np.argsort(-logits_row)[:TOP_K]
    z = logits_row[top].astype(np.float64) / TEMPERATURE
    p = np.exp(z - z.max())
    return dict(zip(top.tolist(), (p / p.sum()).tolist(), strict=True))


def _exact_joint(prompt: list[int]) -> dict[tuple[int, ...], float]:
    runner = Runner(sp.target("llama"))
    joint = {(): 1.0}
    for _ in range(NEW):
        nxt = {}
        for prefix, mass in joint.items():
            logits, _ = full_logits(runner, prompt + list(prefix))
            for token, p in _filtered_probs(logits[-1]).items():
                nxt[(*prefix, token)] = mass * p
        joint = nxt
    return joint


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_sampled_outputs_follow_the_target_distribution(tree):
    prompt = sp.shared_prefix_prompts(seed=11, n=1)[0]
    exact = _exact_joint(prompt)
    extra = dict(speculative_eagle_topk=2, speculative_num_draft_tokens=4) if tree else {}
    engine = sp.engine("llama", max_running=64, chunk=512, num_steps=2, random_seed=1234, **extra)
    n = 1500
    params = {"temperature": TEMPERATURE, "top_k": TOP_K, "max_new_tokens": NEW, "ignore_eos": True}
    outs = engine.generate(input_ids=[prompt] * n, sampling_params=params)
    seen = [tuple(o["output_ids"]) for o in outs]
    assert all(s in exact for s in seen)  # every sample is a top-k continuation
    cells = sorted(exact, key=exact.get, reverse=True)
    observed = np.array([seen.count(c) for c in cells], float)
    expected = np.array([exact[c] * n for c in cells])
    # pool the rare cells (expected < 5) into one, as a chi-square test needs
    rare = expected < 5
    observed = np.append(observed[~rare], observed[rare].sum())
    expected = np.append(expected[~rare], expected[rare].sum())
    if expected[-1] == 0:
        observed, expected = observed[:-1], expected[:-1]
    p_value = stats.chisquare(observed, expected).pvalue
    print(f"chi-square over {len(expected)} cells: p = {p_value:.3f}")
    assert p_value > 1e-3
    accepted = np.concatenate([o["meta_info"]["spec_accept_lengths"] for o in outs])
    print(f"rounds accepting a draft: {(accepted > 0).mean():.3f}")
    assert (accepted > 0).mean() > 0.05 and (accepted == 0).mean() > 0.05
    engine.flush_cache()
