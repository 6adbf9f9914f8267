"""KV memory under pressure and at the edges: eviction and retraction in a tiny pool, abort, flush, leaks."""

import numpy as np
import pytest

from jaxserve.engine import EngineBusyError
from jaxserve.engine.request import Status
from tests.engine.conftest import assert_no_leak, make_engine, prompts

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

GREEDY = {"temperature": 0.0, "max_new_tokens": 12, "ignore_eos": True}


@pytest.mark.parametrize("page_size", [1, 16])
def test_tiny_pool_retracts_and_still_matches_a_roomy_pool(llama, page_size):
    _, model, _ = llama
    rng = np.random.RandomState(3)
    prefix = rng.randint(0, 256, size=20).tolist()
    batch = [prefix + p for p in prompts(4, rng.randint(5, 40, size=8))]
    roomy = make_engine(model, page_size=page_size, max_total_tokens=2048, disable_overlap_schedule=True)
    expected = [o["output_ids"] for o in roomy.generate(input_ids=batch, sampling_params=GREEDY)]
    # room for about two requests at a time: admission fills it, decodes then run out and retract
    tiny = make_engine(model, page_size=page_size, max_total_tokens=128, max_running_requests=8)
    outs = tiny.generate(input_ids=batch, sampling_params=GREEDY)
    assert [o["output_ids"] for o in outs] == expected
    assert tiny.scheduler.num_retractions > 0
    assert_no_leak(tiny)


def test_swa_tiny_pool_retracts_and_still_matches(gpt_oss):
    _, model, _ = gpt_oss
    batch = prompts(8, [30, 12, 25, 40, 9, 33])
    roomy = make_engine(model, page_size=16, chunked_prefill_size=16)
    expected = [o["output_ids"] for o in roomy.generate(input_ids=batch, sampling_params=GREEDY)]
    tiny = make_engine(model, page_size=16, max_total_tokens=128, chunked_prefill_size=16)
    outs = tiny.generate(input_ids=batch, sampling_params=GREEDY)
    assert [o["output_ids"] for o in outs] == expected
    assert tiny.scheduler.num_retractions > 0
    assert_no_leak(tiny)


def test_abort_mid_decode_frees_its_kv(llama):
    _, model, _ = llama
    engine = make_engine(model, disable_radix_cache=True)
    params = {**GREEDY, "max_new_tokens": 50}
    a = engine.submit(input_ids=prompts(9, [30])[0], sampling_params=params)
    b = engine.submit(input_ids=prompts(10, [20])[0], sampling_params=params)
    for _ in range(5):
        engine.step()
    req = engine.request(a)
    assert req.status is Status.RUNNING and len(req.output_ids) >= 3
    held = req.cached.kv_slots.shape[0]
    free_before = engine.kv.available_slots()
    engine.abort(a)
    assert engine.kv.available_slots() == free_before + held
    assert engine.output(a)["meta_info"]["finish_reason"]["type"] == "abort"
    engine.check_memory()
    engine.run_until_idle()
    assert len(engine.output(b)["output_ids"]) == 50
    assert_no_leak(engine)


def test_abort_queued_and_mid_prefill_requests(llama):
    _, model, _ = llama
    engine = make_engine(model, chunked_prefill_size=16, max_running_requests=2)
    rids = [engine.submit(input_ids=p, sampling_params=GREEDY) for p in prompts(11, [60, 50, 10])]
    engine.step()  # rid 0 is mid-prefill (16 of 60 tokens), rid 2 is queued
    assert engine.request(rids[0]).num_computed == 16
    engine.abort(rids[0])
    engine.abort(rids[2])
    engine.abort(rids[2])  # aborting twice is a no-op
    engine.run_until_idle()
    assert engine.request(rids[1]).status is Status.FINISHED
    assert_no_leak(engine)


def test_flush_cache_refuses_while_busy_and_frees_everything_when_idle(llama):
    _, model, _ = llama
    engine = make_engine(model)
    engine.generate(input_ids=prompts(12, [25, 31]), sampling_params=GREEDY)
    assert engine.kv.tree_slots() > 0
    rid = engine.submit(input_ids=prompts(13, [8])[0], sampling_params=GREEDY)
    with pytest.raises(EngineBusyError):
        engine.flush_cache()
    engine.abort(rid)
    assert_no_leak(engine)


def test_full_tree_is_evicted_lru_first_without_retraction(llama):
    _, model, _ = llama
    batch = prompts(14, [50, 50, 50, 50])
    roomy = make_engine(model, max_total_tokens=2048, disable_overlap_schedule=True)
    expected = [roomy.generate(input_ids=p, sampling_params=GREEDY)["output_ids"] for p in batch]
    tiny = make_engine(model, max_total_tokens=128)
    for i, p in enumerate(batch):  # one at a time: each finished request leaves 61 slots in the tree
        assert tiny.generate(input_ids=p, sampling_params=GREEDY)["output_ids"] == expected[i]
        assert tiny.kv.tree_slots() <= 128
    assert tiny.scheduler.num_retractions == 0
    # the oldest prompts were evicted, the newest is still cached
    assert tiny.generate(input_ids=batch[0], sampling_params=GREEDY)["meta_info"]["cached_tokens"] == 0
    again = tiny.generate(input_ids=batch[0], sampling_params=GREEDY)
    assert again["meta_info"]["cached_tokens"] == 49  # all but the last prompt token (always recomputed)
    assert_no_leak(tiny)
