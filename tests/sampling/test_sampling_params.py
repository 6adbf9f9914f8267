"""SamplingParams: SGLang defaults, dict construction, and a specific error for every bad input."""

import pytest

from jaxserve.sampling import InvalidSamplingParamsError, SamplingParams


def test_defaults_are_sglangs():
    params = SamplingParams()
    assert (params.max_new_tokens, params.temperature, params.top_p, params.top_k, params.min_p) == (
        128,
        1.0,
        1.0,
        -1,
        0.0,
    )
    assert (params.repetition_penalty, params.frequency_penalty, params.presence_penalty) == (1.0, 0.0, 0.0)
    assert params.stop == () and params.stop_token_ids == ()
    assert not params.ignore_eos and params.seed is None and not params.return_logprob
    assert params.n == 1 and params.skip_special_tokens
    assert not params.is_greedy and not params.uses_penalties


def test_from_dict_sets_values_and_normalises_stop_lists_to_tuples():
    params = SamplingParams.from_dict(
        {
            "temperature": 0,
            "top_k": 5,
            "stop": "###",
            "stop_token_ids": [3, 7],
            "seed": -4,
            "max_new_tokens": 0,
        }
    )
    assert params.temperature == 0 and params.is_greedy and params.top_k == 5
    assert params.stop == ("###",) and params.stop_token_ids == (3, 7)
    assert params.seed == -4 and params.max_new_tokens == 0
    assert SamplingParams.from_dict({"stop": ["a", "bc"]}).stop == ("a", "bc")
    assert SamplingParams.from_dict(None) == SamplingParams.from_dict({}) == SamplingParams()
    hash(params)  # frozen and hashable once lists became tuples


def test_tiny_temperature_is_greedy_like_sglang():
    assert SamplingParams(temperature=1e-6).is_greedy
    assert not SamplingParams(temperature=1e-4).is_greedy


@pytest.mark.parametrize(
    ("values", "name"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": -0.2}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": -0.01}, "min_p"),
        ({"min_p": 1.01}, "min_p"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"repetition_penalty": -1.0}, "repetition_penalty"),
        ({"frequency_penalty": 2.5}, "frequency_penalty"),
        ({"presence_penalty": -3}, "presence_penalty"),
        ({"max_new_tokens": -1}, "max_new_tokens"),
        ({"n": 2}, "n"),
        ({"stop": ""}, "stop"),
        ({"stop": ["ok", ""]}, "stop"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ],
)
def test_out_of_range_values_raise_naming_the_parameter(values, name):
    with pytest.raises(InvalidSamplingParamsError, match=rf"\b{name}=") as info:
        SamplingParams.from_dict(values)
    assert "expected" in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("values", "name"),
    [
        ({"temperature": "0.7"}, "temperature"),
        ({"temperature": True}, "temperature"),
        ({"top_k": 1.5}, "top_k"),
        ({"top_k": True}, "top_k"),
        ({"max_new_tokens": 10.0}, "max_new_tokens"),
        ({"max_new_tokens": None}, "max_new_tokens"),
        ({"stop": 5}, "stop"),
        ({"stop": ["a", 1]}, "stop"),
        ({"stop_token_ids": "12"}, "stop_token_ids"),
        ({"stop_token_ids": [1.0]}, "stop_token_ids"),
        ({"seed": "42"}, "seed"),
        ({"ignore_eos": 1}, "ignore_eos"),
        ({"return_logprob": "yes"}, "return_logprob"),
    ],
)
def test_wrong_types_raise_naming_the_parameter(values, name):
    with pytest.raises(InvalidSamplingParamsError, match=rf"\b{name}="):
        SamplingParams.from_dict(values)


def test_unknown_keys_are_all_named():
    with pytest.raises(InvalidSamplingParamsError, match="tempreature, top_q") as info:
        SamplingParams.from_dict({"tempreature": 0.5, "top_q": 0.9, "top_p": 0.9})
    assert "supported:" in str(info.value) and "temperature" in str(info.value)


def test_known_but_unsupported_sglang_keys_say_so():
    with pytest.raises(
        InvalidSamplingParamsError, match="structural_tag: SGLang parameters jaxserve does not support"
    ):
        SamplingParams.from_dict({"structural_tag": "{}"})


def test_non_dict_sampling_params_raise():
    with pytest.raises(InvalidSamplingParamsError, match="must be an object"):
        SamplingParams.from_dict([("temperature", 1.0)])


def test_validate_rejects_stop_token_ids_outside_the_vocabulary():
    params = SamplingParams(stop_token_ids=[2, 10, 99])
    with pytest.raises(InvalidSamplingParamsError, match=r"out of range: \[10, 99\]"):
        params.validate(vocab_size=10)
    assert SamplingParams(stop_token_ids=[9]).validate(vocab_size=10).stop_token_ids == (9,)


def test_uses_penalties_flags_each_penalty():
    assert SamplingParams(repetition_penalty=1.1).uses_penalties
    assert SamplingParams(frequency_penalty=0.5).uses_penalties
    assert SamplingParams(presence_penalty=-0.5).uses_penalties


def test_logit_bias_takes_json_keys_and_checks_ranges():
    params = SamplingParams.from_dict({"logit_bias": {"7": 5.0, 3: -100}})
    assert params.logit_bias == ((3, -100.0), (7, 5.0))
    with pytest.raises(InvalidSamplingParamsError, match=r"logit_bias\['7'\]"):
        SamplingParams.from_dict({"logit_bias": {"7": 101}})
    with pytest.raises(InvalidSamplingParamsError, match="token ids as keys"):
        SamplingParams.from_dict({"logit_bias": {"x": 1}})
    with pytest.raises(InvalidSamplingParamsError, match="out of range"):
        SamplingParams(logit_bias={"12": 1}).validate(vocab_size=10)


def test_one_grammar_at_most():
    assert SamplingParams(regex="a+").grammar == ("regex", "a+")
    with pytest.raises(InvalidSamplingParamsError, match="at most one"):
        SamplingParams(regex="a+", ebnf="start: 'a'")
