"""Statistical checks: empirical token frequencies match the reference distribution (fixed seeds).

Each case draws 20,000 tokens from one row's logits on a vocabulary of 8 - one batch row per draw, the same
request seed, num_generated = 0..19,999 (so the per-step key stream is what is tested) - and compares with
sampling_reference.distribution: total variation below 0.015 (expected ~0.006 by chance), a chi-square test
at alpha = 0.001 over the kept tokens, and exactly zero draws of filtered tokens.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tests.sampling.sampling_reference as ref
from jaxserve.sampling import (
    SamplingParams,
    SamplingRow,
    SeedSource,
    build_sampling_batch,
    mark_prompt_tokens,
    new_penalty_pool,
    sample,
    update_counts,
)

NUM_DRAWS = 20_000
# chi-square critical values at alpha = 0.001 for 1..7 degrees of freedom
CHI2_CRITICAL = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515, 6: 22.458, 7: 24.322}
LOGITS = np.array([1.2, 0.3, -0.4, 2.0, 0.9, -1.5, 0.0, 1.6], np.float32)

_sample = jax.jit(sample)


def _draw(params, logits=LOGITS, pool=None, penalty_row=None):
    rows = [
        SamplingRow(params, seed=2024, num_generated=i, penalty_row=penalty_row) for i in range(NUM_DRAWS)
    ]
    tiled = np.tile(logits[None], (NUM_DRAWS, 1))
    tokens = np.asarray(_sample(tiled, build_sampling_batch(rows, NUM_DRAWS), pool).token_ids)
    return np.bincount(tokens, minlength=logits.size) / NUM_DRAWS


def _assert_matches(frequencies, probs):
    assert np.all(frequencies[probs == 0] == 0), f"filtered tokens were drawn: {frequencies}"
    total_variation = 0.5 * np.abs(frequencies - probs).sum()
    assert total_variation < 0.015, f"TV {total_variation:.4f}: {frequencies} vs {probs}"
    kept = probs > 0
    if kept.sum() > 1:
        chi2 = NUM_DRAWS * ((frequencies[kept] - probs[kept]) ** 2 / probs[kept]).sum()
        assert chi2 < CHI2_CRITICAL[int(kept.sum()) - 1], f"chi2 {chi2:.1f}: {frequencies} vs {probs}"


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p", "min_p"),
    [
        (1.0, -1, 1.0, 0.0),
        (0.7, 5, 0.9, 0.0),
        (1.5, 6, 0.8, 0.0),
        (2.0, -1, 0.6, 0.0),
        (1.0, 4, 1.0, 0.0),
        (1.3, -1, 1.0, 0.25),
    ],
)
def test_empirical_distribution_matches_reference(temperature, top_k, top_p, min_p):
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    probs = ref.distribution(LOGITS, temperature, top_k, top_p, min_p)
    _assert_matches(_draw(params), probs)


def test_empirical_distribution_with_penalties_matches_reference():
    prompt, output = [3, 0], [3, 3, 7, 1]
    pool = new_penalty_pool(2, LOGITS.size)
    pool = update_counts(pool, jnp.ones(len(output), jnp.int32), jnp.asarray(output, jnp.int32))
    pool = mark_prompt_tokens(pool, jnp.ones(len(prompt), jnp.int32), jnp.asarray(prompt, jnp.int32))
    params = SamplingParams(
        temperature=0.9, top_k=6, repetition_penalty=1.4, frequency_penalty=0.3, presence_penalty=0.2
    )
    penalised = ref.penalise(LOGITS, prompt, output, 1.4, 0.3, 0.2)
    probs = ref.distribution(penalised, 0.9, 6, 1.0, 0.0)
    _assert_matches(_draw(params, pool=pool, penalty_row=1), probs)


def test_the_check_detects_a_wrong_temperature():
    # Guards the statistics: sampling at T=1 must be rejected against the T=0.7 reference.
    with pytest.raises(AssertionError):
        _assert_matches(_draw(SamplingParams(temperature=1.0)), ref.distribution(LOGITS, 0.7, -1, 1.0, 0.0))


def test_draws_are_independent_across_steps_and_across_requests():
    # Uniform logits on 8 tokens: pairs (step n, step n+1) of one request and (request i, request i+1) at
    # one step must be uniform over the 64 cells (chi-square, 63 degrees of freedom, alpha = 0.001).
    num_requests, vocab_size = 10_000, 8
    logits = np.zeros((num_requests, vocab_size), np.float32)
    source = SeedSource(base_seed=3)
    seeds = [source.next_seed() for _ in range(num_requests)]

    def step(num_generated):
        rows = [SamplingRow(SamplingParams(), seed, num_generated) for seed in seeds]
        return np.asarray(_sample(logits, build_sampling_batch(rows, num_requests)).token_ids)

    first, second = step(0), step(1)
    for a, b in [(first, second), (first[:-1], first[1:])]:
        cells = np.bincount(a * vocab_size + b, minlength=vocab_size**2)
        expected = a.size / vocab_size**2
        assert ((cells - expected) ** 2 / expected).sum() < 103.44
