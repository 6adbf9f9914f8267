"""PenaltyPool updates and apply_penalties against the numpy reference and HF's repetition processor."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tests.sampling.sampling_reference as ref
from jaxserve.sampling import (
    NO_PENALTY_ROW,
    SamplingParams,
    SamplingRow,
    apply_penalties,
    build_sampling_batch,
    clear_rows,
    mark_prompt_tokens,
    new_penalty_pool,
    update_counts,
)


def _pool_with_history(vocab_size, histories):
    """histories[r] = (prompt ids, output ids) of pool row r, fed through the public update functions."""
    pool = new_penalty_pool(len(histories), vocab_size)
    for row, (prompt, output) in enumerate(histories):
        pool = mark_prompt_tokens(pool, jnp.full(len(prompt), row, jnp.int32), jnp.asarray(prompt, jnp.int32))
        for token in output:
            pool = update_counts(pool, jnp.array([row], jnp.int32), jnp.array([token], jnp.int32))
    return pool


def test_update_counts_accumulates_repeats_and_drops_padding_rows():
    pool = new_penalty_pool(3, 5)
    rows = jnp.array([0, 2, 0, NO_PENALTY_ROW], jnp.int32)
    pool = update_counts(pool, rows, jnp.array([4, 1, 4, 2], jnp.int32))
    want = np.zeros((3, 5), np.int32)
    want[0, 4], want[2, 1] = 2, 1
    np.testing.assert_array_equal(pool.output_counts, want)


def test_mark_prompt_and_clear_rows():
    pool = mark_prompt_tokens(
        new_penalty_pool(2, 4), jnp.array([1, 1, 0, NO_PENALTY_ROW]), jnp.array([3, 0, 2, 1])
    )
    np.testing.assert_array_equal(pool.prompt_mask, [[0, 0, 1, 0], [1, 0, 0, 1]])
    pool = update_counts(pool, jnp.array([0, 1]), jnp.array([1, 1]))
    pool = clear_rows(pool, jnp.array([1, NO_PENALTY_ROW]))
    np.testing.assert_array_equal(pool.prompt_mask, [[0, 0, 1, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(pool.output_counts, [[0, 1, 0, 0], [0, 0, 0, 0]])


def test_apply_penalties_matches_numpy_reference():
    rng = np.random.default_rng(3)
    vocab_size, num_rows = 17, 12
    histories = [
        (
            list(rng.integers(0, vocab_size, rng.integers(0, 8))),
            list(rng.integers(0, vocab_size, rng.integers(0, 12))),
        )
        for _ in range(num_rows)
    ]
    pool = _pool_with_history(vocab_size, histories)
    params = [
        SamplingParams(
            repetition_penalty=float(rng.choice([1.0, 0.7, 1.3, 2.0])),
            frequency_penalty=float(rng.choice([0.0, 0.4, -0.3])),
            presence_penalty=float(rng.choice([0.0, 1.1, -0.5])),
        )
        for _ in range(num_rows)
    ]
    # Batch rows visit pool rows in a shuffled order: the pool row, not the batch row, must be read.
    order = rng.permutation(num_rows)
    batch = build_sampling_batch([SamplingRow(params[r], 0, 0, int(r)) for r in order], num_rows + 3)
    logits = (rng.normal(size=(num_rows + 3, vocab_size)) * 3).astype(np.float32)
    logits[0, 0] = -np.inf
    got = np.asarray(jax.jit(apply_penalties)(logits, batch, pool))
    for batch_row, pool_row in enumerate(order):
        prompt, output = histories[pool_row]
        p = params[pool_row]
        want = ref.penalise(
            logits[batch_row], prompt, output, p.repetition_penalty, p.frequency_penalty, p.presence_penalty
        )
        np.testing.assert_allclose(got[batch_row], want, rtol=1e-6, atol=1e-6, err_msg=f"row {batch_row}")
    np.testing.assert_array_equal(got[num_rows:], logits[num_rows:])  # padding rows untouched


def test_neutral_rows_are_bit_identical_even_with_history():
    pool = _pool_with_history(6, [([0, 1], [2, 2, 3])])
    batch = build_sampling_batch([SamplingRow(SamplingParams(), 0, 0, 0)], 2)
    logits = np.array([[-1.5, 2.0, -0.0, 3.25, -np.inf, 0.5]] * 2, np.float32)
    got = np.asarray(apply_penalties(logits, batch, pool))
    np.testing.assert_array_equal(got.view(np.uint32), logits.view(np.uint32))


@pytest.mark.hf
def test_repetition_penalty_matches_hf_processor():
    import torch
    from transformers import RepetitionPenaltyLogitsProcessor

    rng = np.random.default_rng(11)
    vocab_size = 23
    for penalty in (0.5, 1.2, 1.9):
        prompt, output = list(rng.integers(0, vocab_size, 6)), list(rng.integers(0, vocab_size, 5))
        logits = (rng.normal(size=(1, vocab_size)) * 2).astype(np.float32)
        input_ids = torch.tensor([prompt + output])
        want = RepetitionPenaltyLogitsProcessor(penalty)(input_ids, torch.from_numpy(logits.copy())).numpy()
        pool = _pool_with_history(vocab_size, [(prompt, output)])
        batch = build_sampling_batch([SamplingRow(SamplingParams(repetition_penalty=penalty), 0, 0, 0)], 1)
        np.testing.assert_allclose(np.asarray(apply_penalties(logits, batch, pool)), want, rtol=1e-6)


def test_rows_without_a_pool_row_are_not_penalised():
    pool = _pool_with_history(4, [([0, 1], [2, 2, 3])])  # the only (last) pool row has history
    batch = build_sampling_batch([SamplingRow(SamplingParams(), 0, 0)], 1)
    batch = dataclasses.replace(
        batch, repetition_penalty=np.array([2.0], np.float32)
    )  # bypass the host check
    logits = np.array([[1.0, -1.0, 2.0, 0.5]], np.float32)
    np.testing.assert_array_equal(np.asarray(apply_penalties(logits, batch, pool)), logits)
