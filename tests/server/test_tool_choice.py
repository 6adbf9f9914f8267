"""`tool_choice` grammars without a model: random walks through the grammar's token masks (any token the
mask allows, on a real tokenizer) must decode to outputs that the tool-call parsers read as calls of the
chosen tools, with arguments that `jsonschema` validates against the tool's parameters; bad choices are
named. Both grammar backends: the grammars are of the `lark` kind, which llguidance compiles under
xgrammar too. The served side (the official client, 400s) is in test_tool_calls.py and test_harmony.py."""

from __future__ import annotations

import json
import random

import jsonschema
import numpy as np
import pytest

from jaxserve.assets import EMBEDDED_MODEL_DIR
from jaxserve.loader.tokenizer import HFTokenizer
from jaxserve.sampling.grammar import ConstraintBackend, fill_bitmask, make_grammar_backend
from jaxserve.server import harmony, tool_calls, tool_choice
from tests.server.checkpoint import HARMONY_SPECIALS, write_harmony_tokenizer

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6},
                                            "unit": {"enum": ["c", "f"]}},
           "required": ["city"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": -99, "maximum": 99},
                                        "b": {"type": "boolean"}},
       "required": ["a", "b"], "additionalProperties": False}
# definitions referenced from the parameters, as pydantic writes them
MOVE = {"type": "object", "$defs": {"Dir": {"enum": ["up", "down"]}},
        "properties": {"dir": {"$ref": "#/$defs/Dir"}}, "required": ["dir"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "parameters": ADD}},
         {"type": "function", "function": {"name": "move", "parameters": MOVE}}]
SCHEMAS = {"get_weather": WEATHER, "add": ADD, "move": MOVE}


def _walk(backend: ConstraintBackend, tok: HFTokenizer, source: str, vocab: int, seed: int,
          specials: set[int], eos: set[int]) -> str:
    """The text of one random path through the grammar (each token drawn uniformly from the allowed ones;
    an allowed one of `specials` is taken with probability 1/3, so that free text ends). `eos` ends the
    output without being part of its text."""
    matcher, rng, out = backend.matcher("lark", source), random.Random(seed), []
    for _ in range(400):
        bits = np.unpackbits(fill_bitmask([matcher])[0].view(np.uint8), bitorder="little")[:vocab]
        allowed = np.nonzero(bits)[0].tolist()
        ends = [t for t in allowed if t in specials]
        token = rng.choice(ends if ends and rng.random() < 1 / 3 else allowed)
        matcher.advance(token)
        assert matcher.error is None
        if token in eos:
            break
        out.append(token)
        if matcher.stopped:
            break
    assert matcher.stopped, "the walk did not finish the grammar"
    return tok.decode(out, skip_special_tokens=False)


def _check_calls(calls: list[harmony.ToolCall], allowed: set[str]) -> None:
    assert calls
    for call in calls:
        assert call.name in allowed
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])


@pytest.fixture(scope="module", params=["llguidance", "xgrammar"])
def embedded(request):
    tok = HFTokenizer(EMBEDDED_MODEL_DIR)
    return make_grammar_backend(request.param, tok.to_json(), 1024, tok.eos_token_ids), tok


@pytest.mark.parametrize("name,parallel", [(None, True), (None, False), ("add", True)])
def test_tool_call_blocks_parse_and_validate(embedded, name, parallel):
    backend, tok = embedded
    tools = tool_choice.chosen_tools(TOOLS, required=name is None, name=name)
    source = tool_choice.tag_grammar(tools, parallel=parallel)
    counts, names = set(), set()
    for seed in range(30):
        text = _walk(backend, tok, source, 1024, seed, set(tok.eos_token_ids), set(tok.eos_token_ids))
        parsed = tool_calls.parse(text, finished=True)
        assert parsed.content == "" and text.startswith(tool_calls.OPEN)
        _check_calls(parsed.tool_calls, set(tools))
        counts.add(len(parsed.tool_calls))
        names |= {c.name for c in parsed.tool_calls}
    assert names == set(tools)  # every allowed tool is reachable
    assert (max(counts) > 1) == parallel


@pytest.mark.parametrize("backend_name", ["llguidance", "xgrammar"])
def test_harmony_call_parses_and_validates(tmp_path, backend_name):
    write_harmony_tokenizer(tmp_path, "")
    tok = HFTokenizer(tmp_path)
    specials = {tok.token_to_id(t) for t in HARMONY_SPECIALS}
    backend = make_grammar_backend(backend_name, tok.to_json(), 512,
                                   [tok.token_to_id("<|return|>"), tok.token_to_id("<|call|>")])
    for name in (None, "get_weather"):
        tools = tool_choice.chosen_tools(TOOLS, required=name is None, name=name)
        source = tool_choice.harmony_grammar(tools)
        for seed in range(8):
            text = _walk(backend, tok, source, 512, seed, specials, set())
            assert text.endswith("<|call|>")
            parsed = harmony.parse(text, finished=True)
            [call] = parsed.tool_calls
            _check_calls([call], set(tools))
            assert parsed.content == "" and parsed.reasoning_content == ""


@pytest.mark.parametrize("tools,required,name,message", [
    (None, True, None, "needs a non-empty 'tools' list"),
    ([], False, "add", "needs a non-empty 'tools' list"),
    (TOOLS, False, "nope", "'nope', which is not in 'tools'"),
    ([{"type": "function", "function": {"name": "has space"}}], True, None, r"tools\[0\] is not a function"),
    ([{"type": "function", "function": {"name": "f", "parameters": 3}}], True, None, "must be a JSON schema"),
])
def test_bad_choices_are_named(tools, required, name, message):
    with pytest.raises(ValueError, match=message):
        tool_choice.chosen_tools(tools, required=required, name=name)


def test_auto_and_none_constrain_nothing():
    assert tool_choice.chosen_tools(TOOLS, required=False, name=None) == {}
