"""Tool calls of a template-based model (`<tool_call>` blocks, Qwen / Hermes style) with the official
`openai` client: a tiny Llama checkpoint built here whose chat template renders `tools`; its output is
forced into a known answer by a Lark grammar (SGLang's `ebnf` extra), so the expected fields are known
without the parser. A malformed call comes back as text."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from jaxserve.server import tool_calls
from tests.server.checkpoint import write_tiny_checkpoint
from tests.server.conftest import ServerProcess, assert_kv_baseline, flags_of

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

TEMPLATE = (
    "{% if tools %}<|system|>Tools: {% for t in tools %}{{ t['function']['name'] }} {% endfor %}"
    "Call one as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|end|>{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
CALL = ('start: "Let me check." "<tool_call>" '
        '"{\\"name\\": \\"get_weather\\", \\"arguments\\": {\\"city\\": \\"Paris\\"}}" "</tool_call>"')
BROKEN = 'start: "<tool_call>" "{oops" "</tool_call>"'
MESSAGES = [{"role": "user", "content": "weather in Paris?"}]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = write_tiny_checkpoint(tmp_path_factory.mktemp("tools"))
    config = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    return directory


def _serve(directory, *extra: str):
    proc = ServerProcess(["--model-path", str(directory), *flags_of(
        {"page_size": 16, "max_total_tokens": 2048, "chunked_prefill_size": 64, "max_running_requests": 4}),
        *extra])
    yield openai.OpenAI(base_url=proc.url + "/v1", api_key="unused", max_retries=0, timeout=120), proc
    assert proc.stop() == 0, "".join(proc.stderr[-30:])


@pytest.fixture(scope="module")
def served(checkpoint):
    yield from _serve(checkpoint)


@pytest.fixture(scope="module")
def served_xgrammar(checkpoint):
    """The same model under `--grammar-backend xgrammar`: tool_choice grammars (the `lark` kind) are
    compiled by llguidance there too."""
    yield from _serve(checkpoint, "--grammar-backend", "xgrammar")


def test_tool_call_block_becomes_tool_calls_plain_and_streamed(served):
    client, proc = served
    kwargs = dict(model="any", messages=MESSAGES, max_tokens=80, temperature=0, tools=[WEATHER],
                  extra_body={"ebnf": CALL})
    out = client.chat.completions.create(**kwargs)
    [call] = out.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert out.choices[0].message.content == "Let me check." and out.choices[0].finish_reason == "tool_calls"
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == "Let me check."
    [streamed] = [t for d in deltas for t in (d.tool_calls or [])]
    assert streamed.function.arguments == call.function.arguments
    with httpx.Client(base_url=proc.url) as http:
        assert_kv_baseline(http)


def test_malformed_call_is_returned_as_text(served):
    client, _ = served
    out = client.chat.completions.create(model="any", messages=MESSAGES, max_tokens=40, temperature=0,
                                         tools=[WEATHER], extra_body={"ebnf": BROKEN})
    assert out.choices[0].message.content == "<tool_call>{oops</tool_call>"
    assert not out.choices[0].message.tool_calls and out.choices[0].finish_reason == "stop"
    plain = client.chat.completions.create(model="any", messages=MESSAGES, max_tokens=40, temperature=0,
                                           tools=[WEATHER], tool_choice="none", extra_body={"ebnf": CALL})
    assert "<tool_call>" in plain.choices[0].message.content  # tool_choice none: no parsing


@pytest.mark.parametrize("text,finished,content,calls", [
    ('a<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>b', True, "ab", [("f", '{"x": 1}')]),
    ('a<tool_call>{"name": "f"', False, "a", []),
    ("a<tool_", False, "a", []),
    ("a<tool_call>[1]</tool_call>", True, "a<tool_call>[1]</tool_call>", []),
    ('<tool_call>{"name": "f"}</tool_call>\n<tool_call>{"name": "g"}</tool_call>', True, "",
     [("f", "{}"), ("g", "{}")]),
])
def test_parser_on_written_outputs(text, finished, content, calls):
    parsed = tool_calls.parse(text, finished=finished)
    assert parsed.content == content and [(c.name, c.arguments) for c in parsed.tool_calls] == calls


CITY = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]},
                                         "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"], "additionalProperties": False}
SUM = {"type": "object", "properties": {"a": {"type": "integer", "minimum": -9, "maximum": 9},
                                        "b": {"type": "boolean"}},
       "required": ["a", "b"], "additionalProperties": False}
BOUNDED = [{"type": "function", "function": {"name": "get_weather", "parameters": CITY}},
           {"type": "function", "function": {"name": "add", "parameters": SUM}}]


@pytest.mark.parametrize("server", ["served", "served_xgrammar"])
def test_required_and_named_tool_choice_are_enforced(request, server):
    """The random model, left to itself ("auto"), writes no call; "required" and a named function make it
    call (plain and streamed), with arguments valid for the chosen tool's schema; "none" reads no calls.
    Under either grammar backend."""
    client, proc = request.getfixturevalue(server)
    schemas = {"get_weather": CITY, "add": SUM}
    kwargs = dict(model="any", messages=MESSAGES, max_tokens=80, temperature=0, tools=BOUNDED)
    free = client.chat.completions.create(**kwargs)
    assert not free.choices[0].message.tool_calls  # so a call below is the grammar's doing
    named = {"type": "function", "function": {"name": "add"}}
    for choice, allowed in (("required", {"get_weather", "add"}), (named, {"add"})):
        for parallel in (False, True):
            out = client.chat.completions.create(**kwargs, tool_choice=choice, parallel_tool_calls=parallel)
            calls = out.choices[0].message.tool_calls
            assert calls and out.choices[0].finish_reason == "tool_calls", out.choices[0].message
            assert not out.choices[0].message.content and (parallel or len(calls) == 1)
            for call in calls:
                assert call.function.name in allowed
                jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
    chunks = list(client.chat.completions.create(**kwargs, tool_choice=named, parallel_tool_calls=False,
                                                 stream=True))
    [streamed] = [t for c in chunks if c.choices for t in (c.choices[0].delta.tool_calls or [])]
    assert (streamed.function.name, streamed.function.arguments) == (calls[0].function.name,
                                                                     calls[0].function.arguments)
    none = client.chat.completions.create(**kwargs, tool_choice="none")
    assert not none.choices[0].message.tool_calls and none.choices[0].finish_reason != "tool_calls"
    with httpx.Client(base_url=proc.url) as http:
        assert_kv_baseline(http)


@pytest.mark.parametrize("extra,message", [
    ({"tool_choice": "required"}, "needs a non-empty 'tools' list"),
    ({"tools": BOUNDED, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "'nope', which is not in 'tools'"),
    ({"tools": BOUNDED, "tool_choice": {"type": "function"}},
     "tool_choice.NamedToolChoice.function: Field required"),
    ({"tools": BOUNDED, "tool_choice": "always"}, "Input should be 'auto', 'none' or 'required'"),
    ({"tools": BOUNDED, "tool_choice": "required", "response_format": {"type": "json_object"}},
     "cannot be combined with response_format"),
])
def test_bad_tool_choice_is_a_400(served, extra, message):
    client, _ = served
    with pytest.raises(openai.BadRequestError, match=message):
        client.chat.completions.create(model="any", messages=MESSAGES, max_tokens=8, **extra)
    assert client.chat.completions.create(model="any", messages=MESSAGES, max_tokens=2).choices  # still up
