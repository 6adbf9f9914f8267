"""OpenAI `tool_choice` "required" and named functions, enforced by a grammar (a source of the `lark`
grammar kind, which llguidance compiles whatever the grammar backend) rather than asked of the model.

The grammar admits only tool calls in the model's own call format, each call's arguments valid against its
tool's `parameters` JSON schema (laid out as `json.dumps` does, no free whitespace):
- `<tool_call>` blocks (Qwen / Hermes templates, read by `tool_calls`): one block, or with parallel calls one
  or more separated by a newline, each `<tool_call>\\n{"name": NAME, "arguments": ARGS}\\n</tool_call>`;
- harmony (gpt-oss, read by `harmony`): one call straight away,
  `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGS<|call|>`. No reasoning message
  comes first: free reasoning text need not end within `max_tokens` (a random model's does not), and the
  call would then never be written.
"required" allows any of the request's tools, a named choice only that one. Tool names are OpenAI's
`[a-zA-Z0-9_-]{1,64}`, so that they sit in the grammar's string literals as they are.
"""

from __future__ import annotations

import json
import re
from typing import Any

from jaxserve.sampling.grammar import JSON_LAYOUT

_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_LAYOUT = {"x-guidance": JSON_LAYOUT}  # llguidance's options inside a schema: the layout of every JSON


def chosen_tools(tools: list[dict[str, Any]] | None, *, required: bool,
                 name: str | None) -> dict[str, dict[str, Any]]:
    """{tool name: parameters schema} of the tools the output must call: all of `tools` when `required`, the
    one called `name` when given, {} when neither (the choice constrains nothing). Raises ValueError, with a
    message for the client, for no tools, an unknown name or a malformed tool."""
    if not required and name is None:
        return {}
    if not tools:
        wanted = "tool_choice 'required'" if required else f"tool_choice naming {name!r}"
        raise ValueError(f"{wanted} needs a non-empty 'tools' list")
    schemas: dict[str, dict[str, Any]] = {}
    for index, tool in enumerate(tools):
        function = tool.get("function") if tool.get("type", "function") == "function" else None
        tool_name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(tool_name, str) or not _NAME.fullmatch(tool_name):
            raise ValueError(f"tools[{index}] is not a function tool with a name of 1 to 64 letters, digits, "
                             "'_' or '-'")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise ValueError(f"tools[{index}].function.parameters must be a JSON schema object")
        schemas[tool_name] = parameters
    if name is None:
        return schemas
    if name not in schemas:
        raise ValueError(f"tool_choice names function {name!r}, which is not in 'tools' "
                         f"(given: {', '.join(sorted(schemas))})")
    return {name: schemas[name]}


def tag_grammar(tools: dict[str, dict[str, Any]], *, parallel: bool) -> str:
    """Lark source admitting `<tool_call>` blocks calling `tools` (see the module docstring)."""
    calls = " | ".join(f"call_{i}" for i in range(len(tools)))
    lines = ['start: block ("\\n" block)*' if parallel else "start: block",
             f'block: "<tool_call>\\n" ({calls}) "\\n</tool_call>"']
    for i, (name, parameters) in enumerate(tools.items()):
        # the parameters' definitions move to the root, where their "#/$defs/..." references point
        defs = {k: parameters[k] for k in ("$defs", "definitions") if k in parameters}
        arguments = {k: v for k, v in parameters.items() if k not in defs}
        body = {"type": "object", "properties": {"name": {"const": name}, "arguments": arguments},
                "required": ["name", "arguments"], "additionalProperties": False, **defs, **_LAYOUT}
        lines.append(f"call_{i}: %json {json.dumps(body)}")
    return "\n".join(lines) + "\n"


def harmony_grammar(tools: dict[str, dict[str, Any]]) -> str:
    """Lark source admitting a harmony call of one of `tools` (see the module docstring)."""
    calls = " | ".join(f"call_{i}" for i in range(len(tools)))
    lines = [f'start: <|channel|> "commentary to=functions." ({calls})']
    for i, (name, parameters) in enumerate(tools.items()):
        lines.append(f'call_{i}: "{name} " <|constrain|> "json" <|message|> args_{i} <|call|>')
        lines.append(f"args_{i}: %json {json.dumps({**parameters, **_LAYOUT})}")
    return "\n".join(lines) + "\n"
