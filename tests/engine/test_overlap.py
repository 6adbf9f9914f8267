"""The overlap schedule (step t+1 dispatched before step t is read) changes timing, never results."""

import pytest

from jaxserve.engine.request import Status
from tests.engine.conftest import assert_no_leak, make_engine, prompts

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it


@pytest.fixture(scope="module")
def engines(llama):
    _, model, _ = llama
    return {mode: make_engine(model, max_running_requests=4, chunked_prefill_size=32,
                              disable_overlap_schedule=mode == "sync") for mode in ("overlap", "sync")}


def test_overlap_equals_sync_with_stops_seeds_and_penalties(engines):
    batch = prompts(30, [9, 45, 23, 5, 31, 17])
    sync_greedy = engines["sync"].generate(input_ids=batch[0], sampling_params={
        "temperature": 0, "max_new_tokens": 20, "ignore_eos": True})["output_ids"]
    params = [
        {"temperature": 0, "max_new_tokens": 20, "stop_token_ids": [sync_greedy[5]]},  # stops early
        {"temperature": 0.8, "seed": 3, "max_new_tokens": 15, "ignore_eos": True},
        {"temperature": 0, "frequency_penalty": 1.0, "max_new_tokens": 12, "ignore_eos": True},
        {"temperature": 1.0, "top_k": 5, "max_new_tokens": 1, "ignore_eos": True, "seed": 9},
        {"temperature": 0, "max_new_tokens": 25, "ignore_eos": True, "return_logprob": True},
        {"temperature": 0.5, "top_p": 0.8, "seed": 4, "max_new_tokens": 10, "ignore_eos": True},
    ]
    outs = {mode: e.generate(input_ids=batch, sampling_params=params) for mode, e in engines.items()}
    assert [o["output_ids"] for o in outs["overlap"]] == [o["output_ids"] for o in outs["sync"]]
    assert outs["overlap"][0]["meta_info"]["finish_reason"]["type"] == "stop"
    assert len(outs["overlap"][0]["output_ids"]) < 20
    for engine in engines.values():
        assert_no_leak(engine)


def test_abort_while_a_step_is_in_flight(engines):
    engine = engines["overlap"]
    rids = [engine.submit(input_ids=p, sampling_params={"max_new_tokens": 30, "ignore_eos": True})
            for p in prompts(31, [12, 20])]
    for _ in range(4):
        engine.step()
    assert engine.stepper.inflight is not None  # the last dispatched step is not applied yet
    engine.abort(rids[0])
    engine.check_memory()
    engine.run_until_idle()
    assert engine.request(rids[0]).status is Status.ABORTED
    assert len(engine.output(rids[1])["output_ids"]) == 30
    assert_no_leak(engine)
