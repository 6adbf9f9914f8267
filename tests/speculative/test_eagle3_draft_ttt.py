"""The draft trainer's training-time-test unroll computes what the paged draft computes when it serves a
chain: step-0 draft-extend over the prefix, then steps fed with the draft's own hidden state."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.training.draft import ttt_losses, ttt_unroll
from tests.speculative.eagle3_helpers import AUX_IDS, HIDDEN, VOCAB, run_paged, tiny_draft

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

NUM_STEPS = 3
LENGTH = 14


def _rel(a, b):
    return float(np.abs(np.asarray(a, np.float64) - b).max() / np.abs(b).max())


def test_unroll_equals_serving_chain_at_every_step():
    draft = tiny_draft(seed=5)
    rng = np.random.default_rng(5)
    embedding = rng.normal(size=(VOCAB, HIDDEN)).astype(np.float32)
    ids = rng.integers(0, VOCAB, LENGTH).astype(np.int32)
    aux = rng.normal(size=(LENGTH, len(AUX_IDS) * HIDDEN)).astype(np.float32)
    step_logits = [np.asarray(x[0]) for x in ttt_unroll(draft, jnp.asarray(embedding), jnp.asarray(ids[None]),
                                                          jnp.asarray(aux[None]), NUM_STEPS)]
    num_positions = LENGTH - NUM_STEPS
    assert step_logits[0].shape[0] == num_positions
    for t in (0, 4, num_positions - 1):
        chunks = [(ids[1: t + 2], aux[: t + 1])]  # draft-extend: (x_{p+1}, h_p) at positions 0..t
        outs = run_paged(draft, embedding, chunks, page_size=4)
        assert _rel(outs[0][0][t], step_logits[0][t]) <= 2e-5
        for k in range(1, NUM_STEPS):
            chunks.append((ids[t + 1 + k: t + 2 + k], outs[-1][1][-1:]))  # own hidden, position t + k
            outs = run_paged(draft, embedding, chunks, page_size=4)
            assert _rel(outs[-1][0][0], step_logits[k][t]) <= 2e-5


def test_losses_mask_targets_outside_the_draft_vocab_and_agreement_maps_ids():
    draft = tiny_draft(seed=6)
    ids = np.arange(1, 9)[None]
    target_ids = np.asarray(draft.to_target_ids(jnp.arange(draft.config.num_draft_tokens)))
    outside = np.setdiff1d(np.arange(VOCAB), target_ids)
    num_positions = ids.shape[1] - 1
    # a teacher whose argmax is the draft vocab's target id 3 everywhere, except position 0 (outside)
    teacher = np.zeros((1, ids.shape[1], VOCAB), np.float32)
    teacher[0, :, target_ids[3]] = 30.0
    teacher[0, 1, outside[0]] = 40.0
    teacher[0, 1, target_ids[5]] = 35.0  # restricted to the draft vocab, this position would teach id 5
    perfect = np.full((1, num_positions, draft.config.num_draft_tokens), -30.0, np.float32)
    perfect[..., 3] = 30.0
    losses, accs, preds = ttt_losses(draft, jnp.asarray(teacher), [jnp.asarray(perfect)])
    assert float(losses[0]) < 1e-3  # the outside-vocab position is masked out of the loss
    assert abs(float(accs[0]) - (num_positions - 1) / num_positions) < 1e-6  # but counts as a miss
    np.testing.assert_array_equal(np.asarray(preds[0]), np.full((1, num_positions), target_ids[3]))


def test_chain_acceptance_replays_greedy_verification():
    from jaxserve.training.draft import chain_acceptance

    prompt_len, length = 2, 10
    seq = np.arange(100, 100 + length)
    seqs = np.stack([seq, seq])  # row 0 greedy (used), row 1 sampled (ignored)
    preds = np.zeros((2, length - 3, 3), np.int64)
    # position t, step k predicts x_{t+2+k}: right everywhere except step 1 at t = 3
    for t in range(length - 3):
        for k in range(3):
            preds[0, t, k] = seq[min(t + 2 + k, length - 1)]
    preds[0, 3, 1] = -1
    out = chain_acceptance(preds, seqs, prompt_len, num_steps=2)
    # n=2: t=1 accepts 2 -> n=5; t=4 accepts 2 -> n=8 stops (n + 2 >= 10). 2 verifies, 6 tokens.
    assert out == {"mean_tokens_per_verify": 3.0, "acc_length": 3.5, "verifies": 2, "num_steps": 2}
    preds[0, 1, 1] = -1  # now t=1 accepts only 1 -> n=4; t=3 step 1 wrong -> accepts 1 -> n=6; t=5 -> 2
    out = chain_acceptance(preds, seqs, prompt_len, num_steps=2)
    assert out["verifies"] == 3 and out["mean_tokens_per_verify"] == round(7 / 3, 4)
