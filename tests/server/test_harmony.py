"""gpt-oss chat (harmony): the output channels become `reasoning_content`, `content` and `tool_calls`, plain
and streamed, with the official `openai` client against a server over a tiny gpt-oss checkpoint built here
whose tokenizer has harmony's special tokens. The random model's output is forced into a known harmony
transcript with a grammar over those special tokens (SGLang's `ebnf` extra), so the expected fields are
known independently of the parser; the parser is also checked on hand-written transcripts."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from jaxserve.server import harmony
from tests.server.checkpoint import GPT_OSS, write_harmony_tokenizer
from tests.server.checkpoint import HARMONY_SPECIALS as SPECIALS
from tests.server.conftest import ServerProcess, assert_kv_baseline, flags_of

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

# gpt-oss's template, reduced to what this checks: tools and reasoning effort in the system message, roles
TEMPLATE = (
    "<|start|>system<|message|>Reasoning: {{ reasoning_effort | default('medium') }}"
    "{% if tools %} Tools: {% for t in tools %}{{ t['function']['name'] }} {% endfor %}{% endif %}<|end|>"
    "{% for m in messages %}<|start|>{{ m['role'] }}<|message|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant{% endif %}"
)
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "weather of a city",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}}}}}
ANSWER = ('start: <|channel|> "analysis" <|message|> "the user greets" <|end|> <|start|> "assistant" '
          '<|channel|> "final" <|message|> "hello there" <|return|>')
CALL = ('start: <|channel|> "analysis" <|message|> "need weather" <|end|> <|start|> "assistant" '
        '<|channel|> "commentary to=functions.get_weather " <|constrain|> "json" <|message|> '
        '"{\\"city\\": \\"Paris\\"}" <|call|>')


def _write_harmony_checkpoint(directory) -> None:
    from tests.models.helpers import make_hf_checkpoint

    make_hf_checkpoint(directory, "gpt_oss", seed=0, vocab_size=512, max_position_embeddings=512,
                       eos_token_id=[SPECIALS.index("<|return|>"), SPECIALS.index("<|call|>")],
                       bos_token_id=None, **{k: v for k, v in GPT_OSS.items()})
    write_harmony_tokenizer(directory, TEMPLATE)


@pytest.fixture(scope="module")
def oai(tmp_path_factory):
    directory = tmp_path_factory.mktemp("harmony")
    _write_harmony_checkpoint(directory)
    proc = ServerProcess(["--model-path", str(directory), *flags_of(
        {"page_size": 16, "max_total_tokens": 2048, "chunked_prefill_size": 64, "max_running_requests": 4})])
    yield openai.OpenAI(base_url=proc.url + "/v1", api_key="unused", max_retries=0, timeout=120), proc
    assert proc.stop() == 0, "".join(proc.stderr[-30:])


MESSAGES = [{"role": "user", "content": "hello"}]


def test_channels_become_reasoning_and_content(oai):
    client, _ = oai
    out = client.chat.completions.create(model="any", messages=MESSAGES, max_tokens=60, temperature=0,
                                         reasoning_effort="low", extra_body={"ebnf": ANSWER})
    message = out.choices[0].message
    assert message.content == "hello there" and message.model_extra["reasoning_content"] == "the user greets"
    assert not message.tool_calls and out.choices[0].finish_reason == "stop"


def test_tool_call_is_returned_as_tool_calls_also_streamed(oai):
    client, proc = oai
    kwargs = dict(model="any", messages=MESSAGES, max_tokens=80, temperature=0, tools=[WEATHER],
                  extra_body={"ebnf": CALL})
    out = client.chat.completions.create(**kwargs)
    [call] = out.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert out.choices[0].finish_reason == "tool_calls" and out.choices[0].message.content is None
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.model_extra.get("reasoning_content") or "" for d in deltas) == "need weather"
    [streamed] = [t for d in deltas for t in (d.tool_calls or [])]
    assert streamed.function.name == "get_weather" and streamed.function.arguments == call.function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    import httpx

    with httpx.Client(base_url=proc.url) as http:
        assert_kv_baseline(http)


CITY = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]},
                                         "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"], "additionalProperties": False}
FORECAST = {"type": "function", "function": {"name": "forecast", "parameters": CITY}}


def test_required_and_named_tool_choice_give_a_valid_call(oai):
    """The random model, left to itself, writes no call; "required" and a named function make it call on
    the commentary channel with arguments valid for the tool's schema (plain and streamed)."""
    client, _ = oai
    kwargs = dict(model="any", messages=MESSAGES, max_tokens=120, temperature=0, tools=[WEATHER, FORECAST])
    assert not client.chat.completions.create(**kwargs).choices[0].message.tool_calls
    named = {"type": "function", "function": {"name": "forecast"}}
    for choice, allowed in (("required", {"get_weather", "forecast"}), (named, {"forecast"})):
        out = client.chat.completions.create(**kwargs, tool_choice=choice)
        [call] = out.choices[0].message.tool_calls
        assert call.function.name in allowed and out.choices[0].finish_reason == "tool_calls"
        schema = CITY if call.function.name == "forecast" else WEATHER["function"]["parameters"]
        jsonschema.validate(json.loads(call.function.arguments), schema)
    chunks = list(client.chat.completions.create(**kwargs, tool_choice=named, stream=True))
    [streamed] = [t for c in chunks if c.choices for t in (c.choices[0].delta.tool_calls or [])]
    assert (streamed.function.name, streamed.function.arguments) == ("forecast", call.function.arguments)


@pytest.mark.parametrize("text,finished,expected", [
    ("<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final<|message|>hi", True,
     ("hi", "think", [])),
    ("<|channel|>analysis<|message|>thi", False, ("", "thi", [])),
    ("<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": 1}", False, ("", "", [])),
    ("<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": 1}", True,
     ("", "", [("f", '{"a": 1}')])),
    ("<|channel|>commentary<|message|>let me check<|end|><|start|>assistant to=functions.g<|channel|>"
     "commentary json<|message|>{}<|call|>", True, ("let me check", "", [("g", "{}")])),
    ("no channels at all", True, ("no channels at all", "", [])),
])
def test_parser_on_written_transcripts(text, finished, expected):
    parsed = harmony.parse(text, finished=finished)
    calls = [(c.name, c.arguments) for c in parsed.tool_calls]
    assert (parsed.content, parsed.reasoning_content, calls) == expected
