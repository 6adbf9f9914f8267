"""logit_bias, grammar bitmasks and top logprobs inside `sample`, against numpy references."""

from __future__ import annotations

import jax
import numpy as np

from jaxserve.sampling import SamplingParams, SamplingRow, build_sampling_batch, sample
from jaxserve.sampling.constraints import allowed_tokens

V = 70  # not a multiple of 32: the mask's last word is partial


def _logits(seed: int, rows: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(rows, V)).astype(np.float32)


def _bitmask(allowed: np.ndarray) -> np.ndarray:
    """numpy packing: bit j of word w = token 32 w + j."""
    words = -(-allowed.shape[1] // 32)
    padded = np.zeros((allowed.shape[0], words * 32), bool)
    padded[:, : allowed.shape[1]] = allowed
    bits = padded.reshape(allowed.shape[0], words, 32).astype(np.uint64) << np.arange(32, dtype=np.uint64)
    return bits.sum(-1).astype(np.uint32)


def test_bitmask_unpacks_to_the_allowed_tokens():
    allowed = np.random.default_rng(0).random((5, V)) < 0.3
    np.testing.assert_array_equal(np.asarray(allowed_tokens(_bitmask(allowed), V)), allowed)


def test_greedy_follows_logit_bias_and_mask():
    logits = _logits(1, 3)
    params = [SamplingParams(temperature=0, logit_bias={"5": 100.0}), SamplingParams(temperature=0),
              SamplingParams(temperature=0)]
    allowed = np.ones((3, V), bool)
    allowed[1] = False
    allowed[1, [9, 40, 69]] = True
    batch = build_sampling_batch([SamplingRow(p, 0, 0) for p in params], 4, _bitmask(allowed))
    out = sample(np.concatenate([logits, np.zeros((1, V), np.float32)]), batch)
    ids = np.asarray(out.token_ids)
    assert ids[0] == 5
    assert ids[1] == [9, 40, 69][int(np.argmax(logits[1, [9, 40, 69]]))]
    assert ids[2] == int(np.argmax(logits[2]))
    # reported logprobs are the raw distribution's, whatever bias or mask chose the token
    logp = jax.nn.log_softmax(logits, axis=-1)
    np.testing.assert_allclose(np.asarray(out.logprobs)[:3], np.asarray(logp)[np.arange(3), ids[:3]],
                               rtol=1e-5, atol=1e-6)


def test_sampled_rows_never_draw_a_masked_token():
    logits = np.zeros((64, V), np.float32)  # uniform: a mask bug would show quickly
    allowed = np.random.default_rng(2).random((64, V)) < 0.1
    allowed[:, 0] = True
    rows = [SamplingRow(SamplingParams(temperature=1.0), seed=i, num_generated=0) for i in range(64)]
    out = sample(logits, build_sampling_batch(rows, 64, _bitmask(allowed)))
    ids = np.asarray(out.token_ids)
    assert allowed[np.arange(64), ids].all()


def test_top_logprobs_are_the_best_raw_logprobs_in_order():
    logits = _logits(3, 2)
    rows = [SamplingRow(SamplingParams(temperature=0, top_logprobs_num=5), 0, 0),
            SamplingRow(SamplingParams(temperature=0), 0, 0)]
    out = sample(logits, build_sampling_batch(rows, 2))
    logp = np.asarray(jax.nn.log_softmax(logits, axis=-1))
    order = np.argsort(-logp[0])[:20]
    np.testing.assert_array_equal(np.asarray(out.top_ids)[0], order)
    np.testing.assert_allclose(np.asarray(out.top_logprobs)[0], logp[0, order], rtol=1e-5, atol=1e-6)
    none = sample(logits, build_sampling_batch(rows[1:], 2))
    assert not np.asarray(none.top_logprobs).any()  # skipped when no row asks
