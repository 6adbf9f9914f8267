"""gpt-oss's chat format (OpenAI harmony): parse an assistant's output into `reasoning_content`, `content`
and `tool_calls`.

The prompt is the checkpoint's own chat template (it renders system / developer / user / assistant / tool
messages, `tools` and `reasoning_effort`); only the output needs reading here. It is a run of messages
`<|start|>assistant<|channel|>C [to=R] [<|constrain|>json]<|message|>TEXT` ended by `<|end|>`, `<|return|>`
(the answer is done) or `<|call|>` (a tool call); the first message's `<|start|>assistant` is in the
prompt. Channel `analysis` is reasoning, `final` the answer; a message addressed `to=functions.NAME` is a
call of tool NAME with TEXT as its JSON arguments; `commentary` without a recipient is shown as content.
Text must be decoded with special tokens kept. A malformed output is returned as content, never an error.
"""

from __future__ import annotations

import dataclasses
import re

SPECIAL_TOKENS = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>",
                  "<|call|>")
_ENDS = re.compile(r"<\|end\|>|<\|return\|>|<\|call\|>")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")


def is_harmony(tokenizer) -> bool:
    """Whether a tokenizer has harmony's special tokens (a gpt-oss checkpoint)."""
    return tokenizer is not None and all(tokenizer.token_to_id(t) is not None for t in SPECIAL_TOKENS)


@dataclasses.dataclass
class ToolCall:
    name: str
    arguments: str


@dataclasses.dataclass
class Parsed:
    """What the output says so far. `content` and `reasoning_content` only grow as text is appended;
    `tool_calls` lists the complete calls (a call is complete at its `<|call|>`, or when the output ends)."""

    content: str = ""
    reasoning_content: str = ""
    tool_calls: list[ToolCall] = dataclasses.field(default_factory=list)


def parse(text: str, *, finished: bool) -> Parsed:
    """Parse output `text` (special tokens kept). While not `finished`, an open tool call is held back."""
    out = Parsed()
    pos = 0
    while pos < len(text):
        start = text.find("<|message|>", pos)
        if start < 0:  # a header still being generated, or stray text: nothing to show yet
            if finished and "<|channel|>" not in text[pos:]:
                out.content += _plain(text[pos:])
            break
        header = text[pos:start]
        body_start = start + len("<|message|>")
        end = _ENDS.search(text, body_start)
        body = text[body_start: end.start() if end else len(text)]
        closed = end is not None or finished
        _add(out, header, body, closed)
        if end is None:
            break
        pos = end.end()
        if text.startswith("<|start|>", pos):
            pos += len("<|start|>")
    return out


def _add(out: Parsed, header: str, body: str, closed: bool) -> None:
    channel = header.split("<|channel|>", 1)[1] if "<|channel|>" in header else ""
    channel = channel.split("<|constrain|>")[0].strip().split(" ")[0]
    recipient = _RECIPIENT.search(header)
    if recipient and recipient.group(1).startswith("functions."):
        if closed:
            out.tool_calls.append(ToolCall(recipient.group(1)[len("functions."):], body.strip()))
    elif channel == "analysis":
        out.reasoning_content += body
    else:  # final, commentary preambles, or no channel
        out.content += body


def _plain(text: str) -> str:
    for token in SPECIAL_TOKENS:
        text = text.replace(token, "")
    return text
