"""Adaptive speculation stays lossless when a request switches between EAGLE-3 rounds and plain steps
mid-request: the draft catches up over the plain steps' tokens before the next round, so that round starts
from a usable draft state (it still accepts drafts) and greedy output equals the plain engine's token for
token."""

from __future__ import annotations

import pytest

from tests.speculative import spec_pairs as sp

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

GREEDY = {"temperature": 0}
TREE = dict(num_steps=2, speculative_eagle_topk=2, speculative_num_draft_tokens=4)


@pytest.mark.parametrize("drafting", ["chain", "tree"])
@pytest.mark.parametrize("overlap", [True, False])
def test_switching_mid_request_keeps_greedy_output_equal_to_plain(drafting, overlap):
    """A long request decodes alone (rounds), two short ones join (3 decoding >= the disable batch size:
    plain steps for all three), they finish, and the long one goes back to rounds."""
    prompts = sp.shared_prefix_prompts(seed=5, n=3)
    max_new = [48, 8, 10]
    plain = sp.plain_outputs("llama", prompts, [{**GREEDY, "max_new_tokens": m} for m in max_new])
    extra = TREE if drafting == "tree" else dict(num_steps=3)
    engine = sp.engine("llama", speculative_disable_batch_size=3, disable_overlap_schedule=not overlap,
                       **extra)
    long_rid = engine.submit(input_ids=prompts[0], sampling_params={**GREEDY, "max_new_tokens": max_new[0]})
    long_req = engine.request(long_rid)
    while len(long_req.output_ids) < 12:
        engine.step()
    rounds_before = len(long_req.spec_accept_lengths)
    short = [engine.submit(input_ids=p, sampling_params={**GREEDY, "max_new_tokens": m})
             for p, m in zip(prompts[1:], max_new[1:], strict=True)]
    while not all(engine.request(r).finished for r in short):
        engine.step()
    switched_at = len(long_req.spec_accept_lengths)
    engine.run_until_idle()
    outs = [engine.output(r) for r in (long_rid, *short)]
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in plain]
    lengths = long_req.spec_accept_lengths
    assert engine.stats["plain_decode_steps"] > 0 and engine.stats["round_steps"] > 0
    assert 0 in lengths[rounds_before:switched_at]  # plain steps (no draft accepted) while three decoded
    assert max(lengths[switched_at:]) > 0  # back to rounds, and the draft state was still usable
    engine.check_memory()
    engine.flush_cache()


def test_policy_auto_runs_both_paths_and_stays_lossless():
    """`auto` explores rounds and plain steps (timing decides which it keeps): output equals plain."""
    prompts = sp.shared_prefix_prompts(seed=9, n=4)
    params = {**GREEDY, "max_new_tokens": 40}
    plain = sp.plain_outputs("llama", prompts, params)
    engine = sp.engine("llama", num_steps=3, speculative_policy="auto")
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in plain]
    stats = engine.stats
    assert stats["plain_decode_steps"] > 0 and stats["round_steps"] > 0
    for kind in ("round", "plain"):  # each kind's host CPU: counted, and one thread's, so within its wall
        assert 0 < stats[f"{kind}_host_cpu_s"] <= stats[f"{kind}_wall_s"]
    assert 0 < stats["round_dispatch_cpu_s"] <= stats["round_host_cpu_s"]  # the dispatch is host work
    engine.check_memory()
    engine.flush_cache()


@pytest.mark.parametrize("overlap", [True, False])
def test_plain_steps_under_eagle_equal_the_plain_engine_for_sampled_requests(overlap):
    """With every decode step plain (disable batch size 1), the EAGLE-3 engine samples exactly what the
    plain engine samples (same rows, same keys), penalties and seeded sampling included; overlapped, a
    plain step is in flight while the host applies the previous one."""
    prompts = sp.shared_prefix_prompts(seed=21, n=4)
    params = [{**GREEDY, "max_new_tokens": 20},
              {"temperature": 0.9, "top_p": 0.9, "max_new_tokens": 24, "seed": 3},
              {"temperature": 1.1, "top_k": 5, "max_new_tokens": 13, "seed": 4, "frequency_penalty": 0.7},
              {**GREEDY, "max_new_tokens": 17, "presence_penalty": 0.8}]
    plain = sp.plain_outputs("llama", prompts, params)
    engine = sp.engine("llama", num_steps=3, speculative_disable_batch_size=1,
                       disable_overlap_schedule=not overlap)
    rids = [engine.submit(input_ids=p, sampling_params=q) for p, q in zip(prompts, params, strict=True)]
    seen_in_flight = False
    while not engine.idle:
        engine.step()
        seen_in_flight |= engine.stepper.inflight is not None
    assert seen_in_flight == overlap
    assert [engine.output(r)["output_ids"] for r in rids] == [o["output_ids"] for o in plain]
    assert engine.stats["round_steps"] == 0 and engine.stats["plain_decode_steps"] > 0
    engine.check_memory()
    engine.flush_cache()


def test_abort_while_a_plain_step_is_in_flight_leaks_nothing():
    """Overlapped plain steps: aborting a request whose step is in flight frees its KV and draft row now;
    the others finish with the plain engine's output."""
    prompts = sp.shared_prefix_prompts(seed=23, n=3)
    params = {**GREEDY, "max_new_tokens": 16}
    plain = sp.plain_outputs("llama", prompts, params)
    engine = sp.engine("llama", num_steps=3, speculative_disable_batch_size=1)
    rids = [engine.submit(input_ids=p, sampling_params=params) for p in prompts]
    while len(engine.request(rids[1]).output_ids) < 5:
        engine.step()
    assert engine.stepper.inflight is not None
    engine.abort(rids[1])
    assert engine.request(rids[1]) not in engine.stepper.rows
    engine.run_until_idle()
    assert [engine.output(r)["output_ids"] for r in (rids[0], rids[2])] == [plain[0]["output_ids"],
                                                                             plain[2]["output_ids"]]
    assert not engine.stepper.rows
    engine.check_memory()
    engine.flush_cache()


def test_a_prefill_stays_in_flight_while_the_next_plain_step_is_dispatched():
    """Overlapped: the prefill step is not applied when dispatched; the plain step after it is dispatched
    first (it reads the prefill's samples on device), then the prefill is applied. Aborting a request
    while its prefill is in flight leaks nothing; the others finish with the plain engine's output."""
    prompts = sp.shared_prefix_prompts(seed=25, n=3)
    params = [{**GREEDY, "max_new_tokens": 12}, {"temperature": 0.8, "max_new_tokens": 9, "seed": 7},
              {**GREEDY, "max_new_tokens": 10}]
    plain = sp.plain_outputs("llama", prompts, params)
    engine = sp.engine("llama", num_steps=3, speculative_disable_batch_size=1)
    rids = [engine.submit(input_ids=p, sampling_params=q) for p, q in zip(prompts, params, strict=True)]
    reqs = [engine.request(r) for r in rids]
    engine.step()
    assert engine.stats["prefill_steps"] == 1 and engine.stepper.inflight is not None
    assert all(not r.output_ids for r in reqs)  # its samples are still on device
    engine.abort(rids[2])
    assert reqs[2] not in engine.stepper.rows
    engine.step()  # a plain step: dispatched, then the prefill applied
    assert engine.stats["plain_decode_steps"] == 1 and engine.stepper.inflight is not None
    assert [len(r.output_ids) for r in reqs[:2]] == [1, 1]
    engine.run_until_idle()
    assert [engine.output(r)["output_ids"] for r in rids[:2]] == [o["output_ids"] for o in plain[:2]]
    assert not engine.stepper.rows
    engine.check_memory()
    engine.flush_cache()


def test_deferred_draft_extends_leave_the_draft_as_eager_extends():
    """Plain steps defer the draft extend (`speculative.lazy_draft`). Two requests decode plainly for more
    steps than the aux ring holds (catch-ups when it fills), one finishes while its draft lags (its
    cached prefix gets the caught-up draft KV), the other goes back to rounds, and a third request reuses
    the finished one's prefix: every request accepts exactly the drafts it accepts when each plain step
    extends the draft at once (recording diagnostics forces that), and outputs equal plain decoding."""
    prompts = sp.shared_prefix_prompts(seed=31, n=2)
    runs = []
    for eager in (False, True):
        engine = sp.engine("llama", num_steps=3, speculative_disable_batch_size=2)
        if eager:
            engine.stepper.record_draft_top1()
        first = engine.submit(input_ids=prompts[0], sampling_params={**GREEDY, "max_new_tokens": 60})
        while len(engine.request(first).output_ids) < 8:
            engine.step()
        second = engine.submit(input_ids=prompts[1], sampling_params={**GREEDY, "max_new_tokens": 40})
        while not engine.request(second).finished:
            engine.step()
        engine.run_until_idle()
        again = list(prompts[1]) + engine.output(second)["output_ids"][:30]
        third = engine.submit(input_ids=again, sampling_params={**GREEDY, "max_new_tokens": 24})
        engine.run_until_idle()
        rids = (first, second, third)
        runs.append(([engine.output(r)["output_ids"] for r in rids],
                     [list(engine.request(r).spec_accept_lengths) for r in rids], dict(engine.stats)))
        engine.check_memory()
        engine.flush_cache()
    (outs, accepted, stats), (eager_outs, eager_accepted, eager_stats) = runs
    plain = sp.plain_outputs("llama", [prompts[0], prompts[1], again],
                             [{**GREEDY, "max_new_tokens": m} for m in (60, 40, 24)])
    assert outs == eager_outs == [o["output_ids"] for o in plain]
    assert stats["plain_decode_steps"] > 16 and stats["draft_catch_ups"] >= 3
    assert eager_stats["draft_catch_ups"] == 0
    assert accepted == eager_accepted
    assert max(accepted[2]) > 0  # the prefix cached with the caught-up draft KV is usable


def _rounds_lose(engine, batch_size: int) -> None:
    """Give the stepper measurements at `batch_size` where rounds lose: 50 ms for < 4 tokens against 1 ms
    for a plain step, 4 steady samples each (the policy needs 3)."""
    meter = engine.stepper.measured(batch_size)
    for choice, seconds in [(3, 0.05)] * 4 + [(0, 0.001)] * 4:
        meter.record(choice, seconds)


@pytest.mark.parametrize("overlap", [True, False])
def test_requests_drop_their_drafts_once_plain_steps_win_and_stay_lossless(overlap):
    """`auto` at 4 requests, with measurements where rounds lose: the first decode step drops every
    request's draft (no round, no catch-up after that), a request that joins them drops its draft too,
    outputs equal the plain engine's (one request aborted mid-decode leaks nothing), the prefix tree
    caches each finished request's prompt but not its decoded positions (they have no draft KV), and a
    later request alone on a cached prompt runs rounds that accept drafts."""
    prompts = sp.shared_prefix_prompts(seed=13, n=5)
    params = {**GREEDY, "max_new_tokens": 24}
    plain = sp.plain_outputs("llama", prompts, params)
    engine = sp.engine("llama", num_steps=3, speculative_policy="auto", disable_overlap_schedule=not overlap)
    for size in (4, 8):  # the buckets of 3-4 and 5-8 requests
        _rounds_lose(engine, size)
    rids = [engine.submit(input_ids=p, sampling_params=params) for p in prompts[:4]]
    while len(engine.request(rids[3]).output_ids) < 6:
        engine.step()
    assert len(engine.stepper.lag.detached) == 4
    rids.append(engine.submit(input_ids=prompts[4], sampling_params=params))
    while len(engine.request(rids[4]).output_ids) < 3:
        engine.step()
    assert len(engine.stepper.lag.detached) == 5
    engine.abort(rids[3])
    engine.run_until_idle()
    kept = [0, 1, 2, 4]
    assert [engine.output(rids[i])["output_ids"] for i in kept] == [plain[i]["output_ids"] for i in kept]
    stats = engine.stats
    assert stats["drafts_dropped"] == 5 and stats["round_steps"] == 0 and stats["draft_catch_ups"] == 0
    assert not engine.stepper.lag.detached
    engine.check_memory()
    again = list(prompts[0]) + engine.output(rids[0])["output_ids"]
    out = engine.generate(input_ids=[again], sampling_params={**GREEDY, "max_new_tokens": 16})[0]
    assert out["output_ids"] == sp.plain_outputs("llama", [again], {**GREEDY, "max_new_tokens": 16})[0][
        "output_ids"]
    assert 0 < out["meta_info"]["cached_tokens"] <= len(prompts[0])  # the prompt, not the outputs
    assert engine.stats["round_steps"] > 0 and max(out["meta_info"]["spec_accept_lengths"]) > 0
    engine.check_memory()
    engine.flush_cache()


def test_dropped_drafts_survive_retraction_in_a_small_pool():
    """Settled on plain steps in a pool too small for every request: requests without a draft are
    retracted and prefilled again (which rebuilds their draft), outputs still equal the plain engine's and
    nothing leaks."""
    prompts = sp.shared_prefix_prompts(seed=17, n=6)
    params = {**GREEDY, "max_new_tokens": 40}
    plain = sp.plain_outputs("llama", prompts, params)
    engine = sp.engine("llama", num_steps=3, speculative_policy="auto", max_total_tokens=160)
    _rounds_lose(engine, len(prompts))
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in plain]
    assert engine.scheduler.num_retractions > 0 and engine.stats["drafts_dropped"] > len(prompts)  # again
    assert not engine.stepper.lag.detached
    engine.check_memory()
    engine.flush_cache()
