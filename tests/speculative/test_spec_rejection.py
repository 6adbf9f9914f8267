"""Rejection sampling keeps the target's distribution: sampled speculative outputs (temperature 2, top-k 3,
so 27 possible 3-token continuations) are distributed as the target's own token-by-token distribution,
computed independently from full-sequence forwards of the target (chi-square test); and the rounds both
accept and reject drafts, so both branches are exercised."""

from __future__ import annotations

import numpy as np
from scipy import stats

from tests.models.helpers import Runner, full_logits
from tests.speculative import spec_pairs as sp

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


def test_sampled_outputs_follow_the_target_distribution():
    prompt = sp.shared_prefix_prompts(seed=11, n=1)[0]
    exact = _exact_joint(prompt)
    engine = sp.engine("llama", max_running=64, chunk=512, num_steps=2, random_seed=1234)
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


def test_greedy_draft_proposals_tested_against_filtered_probabilities():
    """Unit check of the accept rule on a hand-made 4-token vocabulary: the accept rate of a draft equals its
    filtered target probability, and rejected positions never emit the rejected draft."""
    import jax.numpy as jnp

    from jaxserve.sampling import SamplingParams, SamplingRow, build_sampling_batch
    from jaxserve.speculative.rejection import verify_tokens

    logits = np.log(np.array([0.1, 0.2, 0.3, 0.4], np.float32))
    rows = 4000
    batch = build_sampling_batch([SamplingRow(SamplingParams(temperature=1.0), seed, 0)
                                  for seed in range(rows)], rows)
    proposed = jnp.full(rows, 2, jnp.int32)
    accept, correction = verify_tokens(jnp.tile(logits, (rows, 1)), proposed, batch)
    accept, correction = np.asarray(accept), np.asarray(correction)
    assert abs(accept.mean() - 0.3) < 4 * np.sqrt(0.3 * 0.7 / rows)
    residual = correction[~accept]
    assert not (residual == 2).any()
    freq = np.bincount(residual, minlength=4)[[0, 1, 3]] / residual.size
    np.testing.assert_allclose(freq, np.array([0.1, 0.2, 0.4]) / 0.7, atol=0.03)
    # greedy rows accept the argmax only, and correct to it
    greedy = build_sampling_batch([SamplingRow(SamplingParams(temperature=0.0), 0, 0)] * 4, 4)
    acc, corr = verify_tokens(jnp.tile(logits, (4, 1)), jnp.array([3, 2, 0, -1], jnp.int32), greedy)
    assert np.asarray(acc).tolist() == [True, False, False, False]
    assert np.asarray(corr).tolist() == [3, 3, 3, 3]
