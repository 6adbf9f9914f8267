"""Tool calls of template-based models that write them as `<tool_call>{"name": ..., "arguments": {...}}
</tool_call>` blocks (the format of Qwen's and Hermes' chat templates; used when the request has `tools` and
the model's template mentions `<tool_call>`). gpt-oss writes harmony instead (`harmony`).

A block whose body is not a JSON object with a string `name` stays in the content as text: a tool-call
parse failure returns the text, never an error. While the output runs, everything from the first
`<tool_call>` on is held back (it may become a call), so `content` only grows. Blank text between two
calls (parallel calls one a line) is no content.
"""

from __future__ import annotations

import json
import re

from jaxserve.server.harmony import Parsed, ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.S)


def uses_tool_call_tags(template_source: str | None) -> bool:
    return template_source is not None and OPEN in template_source


def parse(text: str, *, finished: bool) -> Parsed:
    """Content and complete tool calls of output `text` so far (see the module docstring)."""
    if not finished:
        held = text.find(OPEN)
        if held < 0:  # hold back a tail that may still become "<tool_call>"
            held = next((len(text) - k for k in range(min(len(OPEN) - 1, len(text)), 0, -1)
                         if OPEN.startswith(text[-k:])), len(text))
        return Parsed(content=text[:held])
    out = Parsed()
    pos = 0
    for block in _BLOCK.finditer(text):
        call = _call(block.group(1))
        if call is None:
            continue  # stays in the text
        between = text[pos:block.start()]
        if not (out.tool_calls and between.isspace()):  # blank between calls: no content
            out.content += between
        out.tool_calls.append(call)
        pos = block.end()
    out.content += text[pos:]
    return out


def _call(body: str) -> ToolCall | None:
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    return ToolCall(value["name"], arguments if isinstance(arguments, str) else json.dumps(arguments))
