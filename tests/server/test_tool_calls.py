"""Tool calls of a template-based model (`<tool_call>` blocks, Qwen / Hermes style) with the official
`openai` client: a tiny Llama checkpoint built here whose chat template renders `tools`; its output is
forced into a known answer by a Lark grammar (SGLang's `ebnf` extra), so the expected fields are known
without the parser. A malformed call comes back as text."""

from __future__ import annotations

import json

import httpx
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
def served(tmp_path_factory):
    directory = write_tiny_checkpoint(tmp_path_factory.mktemp("tools"))
    config = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    proc = ServerProcess(["--model-path", str(directory), *flags_of(
        {"page_size": 16, "max_total_tokens": 2048, "chunked_prefill_size": 64, "max_running_requests": 4})])
    yield openai.OpenAI(base_url=proc.url + "/v1", api_key="unused", max_retries=0, timeout=120), proc
    assert proc.stop() == 0, "".join(proc.stderr[-30:])


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
