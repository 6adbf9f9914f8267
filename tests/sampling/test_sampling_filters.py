"""Top-k / top-p / min-p filters against the numpy reference (ties, -inf) and HF's logits warpers."""

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tests.sampling.sampling_reference as ref
from jaxserve.sampling import apply_filters

_filters = jax.jit(apply_filters, static_argnames="method")
METHODS = pytest.mark.parametrize("method", ["bisect", "sort"])


def _random_params(rng, num_rows, vocab_size):
    top_k = rng.choice([-1, 1, 2, 3, vocab_size - 1, vocab_size, vocab_size + 5], size=num_rows)
    top_p = rng.choice([1.0, 0.95, 0.8, 0.5, 0.3, 0.05], size=num_rows)
    min_p = rng.choice([0.0, 0.0, 0.05, 0.2, 0.6, 1.0], size=num_rows)
    return top_k.astype(np.int32), top_p.astype(np.float32), min_p.astype(np.float32)


def _logits_with_ties_and_neg_inf(rng, num_rows, vocab_size):
    logits = rng.integers(-3, 4, size=(num_rows, vocab_size)).astype(np.float32) * 0.75
    smooth = rng.random((num_rows, 1)) < 0.5
    logits = np.where(smooth, rng.normal(size=(num_rows, vocab_size)) * 2, logits).astype(np.float32)
    logits[rng.random((num_rows, vocab_size)) < 0.15] = -np.inf
    logits[np.arange(num_rows), rng.integers(0, vocab_size, num_rows)] = 1.0  # never an all -inf row
    return logits


@pytest.mark.parametrize("vocab_size", [2, 7, 33])
@METHODS
def test_filters_match_numpy_reference_with_ties_and_neg_inf(vocab_size, method):
    rng = np.random.default_rng(vocab_size)
    num_rows = 400
    scaled = _logits_with_ties_and_neg_inf(rng, num_rows, vocab_size)
    top_k, top_p, min_p = _random_params(rng, num_rows, vocab_size)
    got = np.asarray(_filters(scaled, top_k, top_p, min_p, method))
    num_checked = 0
    for row in range(num_rows):
        want = ref.keep_mask(scaled[row], top_k[row], top_p[row], min_p[row]) & (scaled[row] > -np.inf)
        decided = ref.mask_margins(scaled[row], top_k[row], top_p[row], min_p[row]) > 1e-5
        np.testing.assert_array_equal((got[row] > -np.inf)[decided], want[decided], err_msg=f"row {row}")
        np.testing.assert_array_equal(got[row][want & decided], scaled[row][want & decided])
        num_checked += decided.sum()
    assert num_checked > 0.95 * num_rows * vocab_size


@METHODS
def test_disabled_filters_return_the_logits_bit_identical(method):
    rng = np.random.default_rng(0)
    scaled = _logits_with_ties_and_neg_inf(rng, 64, 50)
    num_rows = scaled.shape[0]
    top_k = rng.choice([-1, 50, 1000], size=num_rows).astype(np.int32)
    got = np.asarray(
        _filters(scaled, top_k, np.ones(num_rows, np.float32), np.zeros(num_rows, np.float32), method)
    )
    np.testing.assert_array_equal(got.view(np.uint32), scaled.view(np.uint32))


@METHODS
def test_top_k_keeps_every_token_tied_with_the_kth(method):
    scaled = np.array([[1.0, 3.0, 2.0, 3.0, 2.0, -np.inf]], np.float32)
    top_p, min_p = np.ones(1, np.float32), np.zeros(1, np.float32)
    kept = lambda k: np.asarray(_filters(scaled, np.array([k], np.int32), top_p, min_p, method))[0] > -np.inf
    np.testing.assert_array_equal(kept(1), [False, True, False, True, False, False])
    np.testing.assert_array_equal(kept(3), [False, True, True, True, True, False])


@METHODS
def test_top_p_keeps_smallest_prefix_reaching_the_mass(method):
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    scaled = np.log(probs)[None].astype(np.float32)
    kept = lambda p: (
        np.asarray(
            _filters(
                scaled, np.array([-1], np.int32), np.array([p], np.float32), np.zeros(1, np.float32), method
            )
        )[0]
        > -np.inf
    )
    np.testing.assert_array_equal(kept(0.4), [True, False, False, False])
    np.testing.assert_array_equal(kept(0.7), [True, True, False, False])
    np.testing.assert_array_equal(kept(0.9), [True, True, True, False])
    np.testing.assert_array_equal(kept(0.99), [True, True, True, True])


@METHODS
def test_min_p_is_relative_to_the_top_probability(method):
    scaled = np.log(np.array([[0.5, 0.3, 0.15, 0.05]])).astype(np.float32)
    got = np.asarray(
        _filters(
            scaled, np.array([-1], np.int32), np.ones(1, np.float32), np.array([0.5], np.float32), method
        )
    )[0]
    np.testing.assert_array_equal(got > -np.inf, [True, True, False, False])


@pytest.mark.hf
@METHODS
def test_filters_match_hf_warpers_on_tie_free_logits(method):
    import torch
    from transformers import MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    rng = np.random.default_rng(7)
    vocab_size, num_cases = 40, 120
    for case in range(num_cases):
        logits = (rng.normal(size=(1, vocab_size)) * 3).astype(np.float32)
        logits[0, rng.random(vocab_size) < 0.1] = -np.inf
        temperature = float(rng.choice([0.3, 0.7, 1.0, 1.8]))
        top_k = int(rng.choice([-1, 1, 4, 15, vocab_size]))
        top_p = float(rng.choice([1.0, 0.9, 0.6, 0.2]))
        min_p = float(rng.choice([0.0, 0.02, 0.1, 0.5]))

        scores = TemperatureLogitsWarper(temperature)(None, torch.from_numpy(logits.copy()))
        scaled = scores.numpy().copy()
        if top_k > 0:
            scores = TopKLogitsWarper(top_k)(None, scores)
        if top_p < 1.0:
            scores = TopPLogitsWarper(top_p)(None, scores)
        if min_p > 0.0:
            scores = MinPLogitsWarper(min_p)(None, scores)
        got = np.asarray(
            _filters(
                scaled,
                np.array([top_k], np.int32),
                np.array([top_p], np.float32),
                np.array([min_p], np.float32),
                method,
            )
        )
        decided = ref.mask_margins(scaled[0], top_k, top_p, min_p) > 1e-5
        hf_kept = scores.numpy()[0] > -np.inf
        np.testing.assert_array_equal((got[0] > -np.inf)[decided], hf_kept[decided], err_msg=f"case {case}")
        np.testing.assert_array_equal(got[0][hf_kept], scores.numpy()[0][hf_kept])


def test_bisect_top_k_is_exact_on_adversarial_values():
    tiny = np.float32(2e-38)  # near the smallest normal (XLA on CPU flushes subnormals to zero)
    one_up = np.nextafter(np.float32(1.0), np.float32(2.0))
    rows = [
        [1.0, one_up, 1.0, -np.inf, 0.5, -0.5],
        [-0.0, 0.0, -tiny, tiny, -np.inf, -np.inf],
        [-3e38, 3e38, -1e-30, 1e-30, 0.0, -np.inf],
        [-np.inf, -np.inf, -np.inf, 2.0, -np.inf, -np.inf],
        [-7.0, -7.0, -7.0, -7.0, -7.0, -7.0],
    ]
    scaled = np.array(rows, np.float32)
    num_rows, vocab_size = scaled.shape
    for k in range(1, vocab_size):
        top_k = np.full(num_rows, k, np.int32)
        args = (scaled, top_k, np.ones(num_rows, np.float32), np.zeros(num_rows, np.float32))
        bisect = np.asarray(_filters(*args, "bisect"))
        np.testing.assert_array_equal(bisect, np.asarray(_filters(*args, "sort")), err_msg=f"k={k}")
        for row in range(num_rows):
            want = ref.keep_mask(scaled[row], k, 1.0, 0.0) & (scaled[row] > -np.inf)
            np.testing.assert_array_equal(bisect[row] > -np.inf, want, err_msg=f"k={k} row={row}")


def test_unknown_filter_method_raises():
    with pytest.raises(ValueError, match="unknown filter method 'heap'"):
        apply_filters(np.zeros((1, 3), np.float32), np.ones(1, np.int32), np.ones(1), np.zeros(1), "heap")


_VALUES = st.sampled_from([-np.inf, -2.5, -1.0, -0.0, 0.0, 0.25, 1.0, 1.5, 3.0])


@pytest.mark.parametrize("method", ["bisect", "sort"])
@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    row=st.lists(_VALUES, min_size=6, max_size=6).filter(lambda r: max(r) > -np.inf),
    top_k=st.sampled_from([-1, 1, 2, 3, 5, 6]),
    top_p=st.sampled_from([1.0, 0.99, 0.7, 0.45, 0.1]),
    min_p=st.sampled_from([0.0, 0.1, 0.3, 0.9]),
)
def test_filters_match_reference_on_generated_rows(method, row, top_k, top_p, min_p):
    scaled = np.array([row], np.float32)
    got = np.asarray(
        _filters(
            scaled,
            np.array([top_k], np.int32),
            np.array([top_p], np.float32),
            np.array([min_p], np.float32),
            method,
        )
    )[0]
    want = ref.keep_mask(scaled[0], top_k, top_p, min_p) & (scaled[0] > -np.inf)
    decided = ref.mask_margins(scaled[0], top_k, top_p, min_p) > 1e-5
    np.testing.assert_array_equal((got > -np.inf)[decided], want[decided])
