"""`choose_draft_steps`: the per-step choice between plain decoding and an EAGLE-3 round, checked against a
brute-force model (simulated rounds for the expected tokens, an explicit argmax for the choice)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxserve.speculative.policy import StepCosts, choose_draft_steps, expected_tokens


def _measured(seconds: dict[int, float], samples: int = 5) -> StepCosts:
    return StepCosts(seconds=seconds, samples=dict.fromkeys(seconds, samples),
                     since_tried=dict.fromkeys(seconds, 1), last=None, run_length=10)


@pytest.mark.parametrize("rate", [0.0, 0.3, 0.8, 1.0])
@pytest.mark.parametrize("k", [0, 1, 3])
def test_expected_tokens_matches_simulated_rounds(rate, k):
    rng = np.random.default_rng(0)
    accepted = rng.random((200_000, k)) < rate
    # a round emits the accepted prefix of drafts plus one token (correction or bonus)
    emitted = 1 + np.cumprod(accepted, axis=1).sum(axis=1) if k else np.ones(200_000)
    assert expected_tokens(k, rate) == pytest.approx(emitted.mean(), abs=0.02)


def test_disable_batch_size_overrides_every_policy():
    for policy in ("auto", "always"):
        assert choose_draft_steps(8, options=(0, 3), policy=policy, disable_batch_size=8) == 0
        assert choose_draft_steps(9, options=(0, 3), policy=policy, disable_batch_size=8) == 0
    assert choose_draft_steps(7, options=(0, 3), policy="always", disable_batch_size=8) == 3


def test_always_speculates_with_the_most_draft_steps_and_never_does_not():
    slow_rounds = _measured({0: 0.001, 3: 1.0})
    assert choose_draft_steps(64, options=(0, 2, 3), policy="always", costs=slow_rounds) == 3
    fast_rounds = _measured({0: 1.0, 3: 0.001})
    assert choose_draft_steps(1, options=(0, 3), policy="never", accept_rate=1.0, costs=fast_rounds) == 0


def test_auto_tries_each_option_until_measured_largest_first():
    assert choose_draft_steps(8, options=(0, 3)) == 3
    half = StepCosts(seconds={3: 0.01}, samples={3: 3}, since_tried={3: 0}, last=3, run_length=3)
    assert choose_draft_steps(8, options=(0, 3), accept_rate=0.9, costs=half) == 0


def test_auto_keeps_a_fresh_choice_for_min_run_steps():
    costs = StepCosts(seconds={0: 0.001, 3: 1.0}, samples={0: 9, 3: 9}, since_tried={0: 2, 3: 0}, last=3,
                      run_length=1)
    assert choose_draft_steps(8, options=(0, 3), accept_rate=0.5, costs=costs, min_run=3) == 3
    done = StepCosts(**{**costs.__dict__, "run_length": 3})
    assert choose_draft_steps(8, options=(0, 3), accept_rate=0.5, costs=done, min_run=3) == 0


def test_auto_reprobes_an_option_not_tried_for_a_while():
    costs = StepCosts(seconds={0: 0.001, 3: 1.0}, samples={0: 9, 3: 9}, since_tried={0: 0, 3: 64},
                      last=0, run_length=20)
    assert choose_draft_steps(8, options=(0, 3), accept_rate=0.5, costs=costs, reprobe_after=64) == 3
    costs = StepCosts(**{**costs.__dict__, "since_tried": {0: 0, 3: 63}})
    assert choose_draft_steps(8, options=(0, 3), accept_rate=0.5, costs=costs, reprobe_after=64) == 0


@settings(max_examples=300, deadline=None)
@given(rate=st.floats(0.0, 1.0), t0=st.floats(1e-4, 1.0), t2=st.floats(1e-4, 1.0), t3=st.floats(1e-4, 1.0),
       margin=st.floats(0.0, 0.5))
def test_auto_picks_the_most_tokens_per_second(rate, t0, t2, t3, margin):
    seconds = {0: t0, 2: t2, 3: t3}
    got = choose_draft_steps(16, options=(0, 2, 3), accept_rate=rate, costs=_measured(seconds), margin=margin)

    def score(k):  # brute force: every option's tokens per second, speculation handicapped by the margin
        tokens = sum(rate ** i for i in range(k + 1))
        return tokens / seconds[k] / (1.0 if k == 0 else 1.0 + margin)

    best = max(score(k) for k in seconds)
    assert score(got) == pytest.approx(best, rel=1e-9)


def test_auto_without_acceptance_prefers_plain():
    assert choose_draft_steps(8, options=(0, 3), accept_rate=None, costs=_measured({0: 0.01, 3: 0.0101})) == 0


@pytest.mark.parametrize("batch_size", [1, 2, 3])
def test_auto_at_small_batches_decides_from_acceptance_alone(batch_size):
    """Timings do not matter below 4 requests (deterministic steps); low acceptance turns rounds off,
    and they are re-tried after `reprobe_after` steps."""
    slow_rounds = _measured({0: 0.001, 3: 1.0})
    assert choose_draft_steps(batch_size, options=(0, 3), accept_rate=None, costs=slow_rounds) == 3
    assert choose_draft_steps(batch_size, options=(0, 3), accept_rate=0.3, costs=slow_rounds) == 3  # 1.42
    fast_rounds = _measured({0: 1.0, 3: 0.001})
    assert choose_draft_steps(batch_size, options=(0, 3), accept_rate=0.1, costs=fast_rounds) == 0  # 1.11
    stale = StepCosts(**{**fast_rounds.__dict__, "since_tried": {0: 0, 3: 64}})
    assert choose_draft_steps(batch_size, options=(0, 3), accept_rate=0.1, costs=stale) == 3


@pytest.mark.parametrize("batch_size", [1, 3])
def test_auto_at_small_batches_gives_a_request_without_rounds_rounds(batch_size):
    """Poor acceptance (of the batch's own rounds) turns rounds off at small batches, unless a decoding
    request has run no round yet (`fresh`): its drafts are not judged by the others'."""
    fast_rounds = _measured({0: 1.0, 3: 0.001})
    assert choose_draft_steps(batch_size, options=(0, 3), accept_rate=0.05, costs=fast_rounds) == 0
    assert choose_draft_steps(batch_size, options=(0, 3), accept_rate=0.05, fresh=True,
                              costs=fast_rounds) == 3
    slow_rounds = _measured({0: 0.001, 3: 1.0})  # from 4 requests on, timings decide, fresh or not
    assert choose_draft_steps(8, options=(0, 3), accept_rate=0.9, fresh=True, costs=slow_rounds) == 0


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="policy"):
        choose_draft_steps(1, options=(0, 3), policy="sometimes")
    with pytest.raises(ValueError, match="include 0"):
        choose_draft_steps(1, options=(3,))
