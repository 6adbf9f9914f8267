"""sample(): greedy, logprobs, row independence, seeded reproducibility, filtering, one trace per bucket."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.sampling import (
    SamplingParams,
    SamplingRow,
    SeedSource,
    build_sampling_batch,
    new_penalty_pool,
    sample,
    update_counts,
)

_sample = jax.jit(sample)
VOCAB = 32


def _logits(num_rows, seed=0, vocab_size=VOCAB):
    return (np.random.default_rng(seed).normal(size=(num_rows, vocab_size)) * 2).astype(np.float32)


def _mixed_rows(rng, num_rows):
    choices = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.8, top_k=5),
        SamplingParams(temperature=1.3, top_p=0.7),
        SamplingParams(temperature=1.0, min_p=0.1),
        SamplingParams(temperature=0.5, top_k=10, top_p=0.9, min_p=0.05),
        SamplingParams(),
    ]
    return [
        SamplingRow(
            choices[int(rng.integers(len(choices)))], seed=int(rng.integers(1 << 62)), num_generated=i
        )
        for i in range(num_rows)
    ]


def test_greedy_rows_take_the_argmax_and_report_its_raw_logprob():
    logits = _logits(8)
    logits[3, 5] = logits[3].max()  # a tie: argmax takes the lowest index, as numpy/torch do
    rows = [
        SamplingRow(SamplingParams(temperature=0.0, top_k=3, top_p=0.1), seed=i, num_generated=0)
        for i in range(8)
    ]
    out = _sample(logits, build_sampling_batch(rows, 8))
    np.testing.assert_array_equal(out.token_ids, logits.argmax(-1))
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    np.testing.assert_allclose(out.logprobs, log_probs[np.arange(8), logits.argmax(-1)], rtol=1e-5, atol=1e-6)


def test_greedy_with_penalties_takes_argmax_of_penalised_logits():
    logits = np.array([[3.0, 2.9, -1.0, 0.0]], np.float32)
    pool = update_counts(new_penalty_pool(1, 4), jnp.array([0]), jnp.array([0]))
    params = SamplingParams(temperature=0.0, repetition_penalty=1.5)
    out = _sample(logits, build_sampling_batch([SamplingRow(params, 0, 1, penalty_row=0)], 1), pool)
    assert int(out.token_ids[0]) == 1  # 3.0 / 1.5 = 2.0 < 2.9
    # logprob is of the raw distribution, not the penalised one
    raw = logits[0] - np.log(np.exp(logits[0]).sum())
    np.testing.assert_allclose(out.logprobs[0], raw[1], rtol=1e-6)


def test_sampled_logprobs_are_raw_log_softmax_at_the_chosen_token():
    rng = np.random.default_rng(1)
    logits = _logits(16, seed=1)
    out = _sample(logits, build_sampling_batch(_mixed_rows(rng, 16), 16))
    log_probs = logits - np.log(np.exp(logits.astype(np.float64)).sum(-1, keepdims=True))
    np.testing.assert_allclose(out.logprobs, log_probs[np.arange(16), np.asarray(out.token_ids)], rtol=1e-5)


def test_rows_in_a_mixed_batch_equal_the_same_rows_sampled_alone():
    rng = np.random.default_rng(2)
    rows = _mixed_rows(rng, 12)
    logits = _logits(16, seed=2)
    together = np.asarray(_sample(logits, build_sampling_batch(rows, 16)).token_ids)
    for i, row in enumerate(rows):
        alone = _sample(logits[i : i + 1], build_sampling_batch([row], 1))
        assert int(alone.token_ids[0]) == together[i], f"row {i}"


def test_seeded_request_gives_the_same_tokens_in_any_batch_position_and_bucket():
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=1234)
    row_logits = _logits(1, seed=9)[0]
    tokens_by_placement = []
    for bucket, position, seed in [(1, 0, 5), (4, 3, 6), (16, 7, 7)]:
        rng = np.random.default_rng(seed)
        tokens = []
        for step in range(20):
            others = _mixed_rows(rng, bucket - 1)
            rows = [*others[:position], SamplingRow(params, params.seed, step), *others[position:]]
            logits = _logits(bucket, seed=100 + step)
            logits[position] = row_logits
            tokens.append(int(_sample(logits, build_sampling_batch(rows, bucket)).token_ids[position]))
        tokens_by_placement.append(tokens)
    assert tokens_by_placement[0] == tokens_by_placement[1] == tokens_by_placement[2]
    assert len(set(tokens_by_placement[0])) > 3  # the key really advances with num_generated


def test_different_seeds_and_seed_source_give_different_streams():
    logits = np.zeros((64, VOCAB), np.float32)  # uniform: any key difference shows
    source = SeedSource(base_seed=0)
    rows = [SamplingRow(SamplingParams(), source.next_seed(), num_generated=0) for _ in range(64)]
    tokens = np.asarray(_sample(logits, build_sampling_batch(rows, 64)).token_ids)
    assert len(set(tokens.tolist())) > 20
    replay = SeedSource(base_seed=0)
    replay_rows = [SamplingRow(SamplingParams(), replay.next_seed(), 0) for _ in range(64)]
    np.testing.assert_array_equal(_sample(logits, build_sampling_batch(replay_rows, 64)).token_ids, tokens)


def test_filtered_and_neg_inf_tokens_are_never_sampled():
    num_rows = 2000
    logits = np.tile(np.array([[2.0, 1.9, 1.8, -np.inf, 1.7, 0.0, -5.0, 1.0]], np.float32), (num_rows, 1))
    params = SamplingParams(temperature=2.0, top_k=4)  # keeps ids 0, 1, 2, 4
    rows = [SamplingRow(params, seed=77, num_generated=i) for i in range(num_rows)]
    tokens = np.asarray(_sample(logits, build_sampling_batch(rows, num_rows)).token_ids)
    assert set(tokens.tolist()) == {0, 1, 2, 4}


def test_bfloat16_logits_are_accepted_and_sampled_in_float32():
    logits = _logits(4).astype(jnp.bfloat16)
    rows = [SamplingRow(SamplingParams(temperature=0.0), 0, 0)] * 4
    out = _sample(logits, build_sampling_batch(rows, 4))
    assert out.logprobs.dtype == jnp.float32 and out.token_ids.dtype == jnp.int32
    np.testing.assert_array_equal(out.token_ids, np.asarray(logits.astype(np.float32)).argmax(-1))


def test_one_trace_per_bucket_shape_whatever_the_parameters():
    num_traces = 0

    def counted(logits, batch, penalties):
        nonlocal num_traces
        num_traces += 1
        return sample(logits, batch, penalties)

    step = jax.jit(counted)
    rng = np.random.default_rng(4)
    pool = new_penalty_pool(4, VOCAB)
    for bucket in (4, 8, 4, 8):
        for _ in range(3):
            rows = _mixed_rows(rng, int(rng.integers(1, bucket + 1)))
            step(_logits(bucket), build_sampling_batch(rows, bucket), pool).token_ids.block_until_ready()
    assert num_traces == 2


@pytest.mark.parametrize("bucket", [1, 3])
def test_penalised_rows_sample_from_the_penalised_distribution(bucket):
    # Token 0 dominates until a huge presence penalty removes it; it must then never be drawn.
    logits = np.tile(np.array([[5.0, 0.0, 0.0, 0.0]], np.float32), (bucket, 1))
    pool = update_counts(new_penalty_pool(bucket, 4), jnp.arange(bucket), jnp.zeros(bucket, jnp.int32))
    params = SamplingParams(presence_penalty=2.0, frequency_penalty=2.0)
    draws = []
    for step in range(300):
        rows = [SamplingRow(params, seed=r, num_generated=step, penalty_row=r) for r in range(bucket)]
        draws.extend(np.asarray(_sample(logits, build_sampling_batch(rows, bucket), pool).token_ids).tolist())
    frequency_of_0 = draws.count(0) / len(draws)
    # reference: softmax([1, 0, 0, 0]) gives token 0 a probability of e / (e + 3) = 0.475
    assert abs(frequency_of_0 - np.e / (np.e + 3)) < 0.08


def test_sort_and_bisect_filter_methods_sample_the_same_tokens():
    rng = np.random.default_rng(6)
    rows = _mixed_rows(rng, 64)
    logits, batch = _logits(64, seed=6), build_sampling_batch(rows, 64)
    by_method = {
        method: np.asarray(
            jax.jit(sample, static_argnames="filter_method")(logits, batch, filter_method=method).token_ids
        )
        for method in ("bisect", "sort")
    }
    np.testing.assert_array_equal(by_method["bisect"], by_method["sort"])
