"""Bad input gets a specific error before anything is queued, never a crash or a leaked slot."""

import pytest

from jaxserve.engine import InvalidRequestError, PromptTooLongError, RequestTooLargeError, UnknownRequestError
from jaxserve.sampling import InvalidSamplingParamsError
from tests.engine.conftest import assert_no_leak, make_engine, prompts

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it


@pytest.fixture(scope="module")
def engine(llama):
    _, model, _ = llama
    return make_engine(model, max_total_tokens=64, context_length=100)


@pytest.mark.parametrize(("kwargs", "error", "words"), [
    ({"input_ids": []}, InvalidRequestError, "empty"),
    ({"input_ids": [[], [1, 2]]}, InvalidRequestError, "request 0: the prompt is empty"),
    ({"input_ids": [1, 256]}, InvalidRequestError, "outside the vocabulary"),
    ({"input_ids": [-1, 3]}, InvalidRequestError, "outside the vocabulary"),
    ({"input_ids": [1, 2], "prompt": "hi"}, InvalidRequestError, "exactly one"),
    ({}, InvalidRequestError, "exactly one"),
    ({"input_ids": list(range(100))}, PromptTooLongError, "context length is 100"),
    ({"input_ids": [1], "sampling_params": {"temperature": -1}}, InvalidSamplingParamsError, "temperature"),
    ({"input_ids": [1], "sampling_params": {"top_p": 0}}, InvalidSamplingParamsError, "top_p"),
    ({"input_ids": [1], "sampling_params": {"top_p": 1.5}}, InvalidSamplingParamsError, "top_p"),
    ({"input_ids": [1], "sampling_params": {"max_new_tokens": -1}}, InvalidSamplingParamsError, "max_new"),
    ({"input_ids": [1], "sampling_params": {"tempreature": 0}}, InvalidSamplingParamsError, "tempreature"),
    ({"input_ids": [1], "sampling_params": {"stop_token_ids": [300]}}, InvalidSamplingParamsError, "vocab"),
    ({"input_ids": [[1], [2]], "sampling_params": [{}]}, InvalidRequestError, "1 sampling_params for 2"),
])
def test_bad_requests_raise_specific_errors_and_queue_nothing(engine, kwargs, error, words):
    with pytest.raises(error, match=words):
        engine.generate(**kwargs)
    assert engine.idle
    engine.check_memory()


def test_request_larger_than_the_pool_is_refused_but_a_long_queue_waits(engine):
    with pytest.raises(RequestTooLargeError, match="max_total_tokens"):
        engine.generate(input_ids=[1] * 60, sampling_params={"max_new_tokens": 6})  # 65 KV tokens > 64
    engine.generate(input_ids=[1] * 60, sampling_params={"max_new_tokens": 5, "ignore_eos": True})  # 64: fits
    # 20 requests of 40 tokens each: far more than the 64-slot pool holds at once; they queue and finish
    outs = engine.generate(input_ids=prompts(0, [20] * 20),
                           sampling_params={"max_new_tokens": 20, "ignore_eos": True, "temperature": 0})
    assert all(len(o["output_ids"]) == 20 for o in outs)
    assert_no_leak(engine)


def test_max_new_tokens_is_clamped_to_the_context_and_zero_returns_at_once(llama, engine):
    roomy = make_engine(llama[1], max_total_tokens=256, context_length=100)
    params = {"max_new_tokens": 50, "ignore_eos": True}
    out = roomy.generate(input_ids=list(range(95)), sampling_params=params)
    assert out["meta_info"]["completion_tokens"] == 5
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    out = engine.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 0})
    assert out["output_ids"] == [] and out["meta_info"]["finish_reason"] == {"type": "length", "length": 0}


def test_text_without_tokenizer_and_unknown_ids(engine):
    with pytest.raises(InvalidRequestError, match="tokenizer"):
        engine.generate("hello")
    with pytest.raises(UnknownRequestError):
        engine.abort("no-such-request")


def test_one_bad_request_in_a_batch_queues_none(engine):
    with pytest.raises(PromptTooLongError, match="request 1"):
        engine.generate(input_ids=[[1, 2, 3], list(range(100))], sampling_params={"max_new_tokens": 4})
    assert engine.idle and not engine._requests
