"""Constrained decoding end to end on the embedded default: outputs under random JSON schemas parse and
validate (jsonschema is the independent judge), regex / EBNF outputs match, grammars are data (no
compilation per grammar), and constrained outputs (greedy and seeded) are equal with and without EAGLE-3,
whose rounds then accept drafts. The same holds under the optional xgrammar backend."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxserve.api import Engine
from jaxserve.assets import EMBEDDED_MODEL_DIR
from jaxserve.engine.errors import InvalidRequestError
from jaxserve.sampling.errors import InvalidSamplingParamsError
from jaxserve.speculative.loading import load_draft

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

FLAGS = dict(page_size=16, max_total_tokens=8192, chunked_prefill_size=64, max_running_requests=32)
PROMPTS = ["The quick brown fox", "Hello", "def main():", "Question: what is the capital of France?"]

# Bounded leaves (short strings without escapes, small integer ranges), arrays of at most 2 items: every
# valid output is short, so an output that runs to max_new_tokens is a failure to close the value.
_LEAF = st.one_of(
    st.integers(0, 5).map(lambda n: {"type": "string", "pattern": f"^[a-z]{{0,{n}}}$"}),
    st.tuples(st.integers(-50, 50), st.integers(0, 99)).map(
        lambda t: {"type": "integer", "minimum": t[0], "maximum": t[0] + t[1]}),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.lists(st.text("abc", min_size=1, max_size=3), min_size=1, max_size=3, unique=True).map(
        lambda xs: {"enum": xs}),
)
SCHEMAS = st.recursive(_LEAF, lambda inner: st.one_of(
    st.tuples(inner, st.integers(0, 2)).map(lambda t: {"type": "array", "items": t[0], "maxItems": t[1]}),
    st.dictionaries(st.sampled_from(["a", "id", "name", "xs"]), inner, min_size=1, max_size=3).map(
        lambda props: {"type": "object", "properties": props, "required": sorted(props),
                       "additionalProperties": False}),
), max_leaves=3)
BATCH = 25


@pytest.fixture(scope="module")
def engine():
    return Engine(model_path=str(EMBEDDED_MODEL_DIR), **FLAGS)


@pytest.mark.slow
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(schemas=st.lists(SCHEMAS, min_size=BATCH, max_size=BATCH), temperature=st.sampled_from([0.0, 1.0]))
def test_outputs_under_random_schemas_parse_and_validate(engine, schemas, temperature):
    """4 x 25 = 100 random schemas, each batch decoded together (masks of different grammars per row)."""
    params = [{"json_schema": json.dumps(s), "temperature": temperature, "seed": i, "max_new_tokens": 200}
              for i, s in enumerate(schemas)]
    outs = engine.generate([PROMPTS[i % len(PROMPTS)] for i in range(BATCH)], params)
    for schema, out in zip(schemas, outs, strict=True):
        assert out["meta_info"]["finish_reason"]["type"] == "stop", (schema, out["text"])
        jsonschema.validate(json.loads(out["text"]), schema)


def test_regex_and_ebnf_outputs_match_and_compile_nothing_new(engine):
    prompts = ["Hello", "x", "The quick brown fox"]

    def run(regex: str, ebnf: str, regex2: str):
        return engine.generate(prompts, [
            {"max_new_tokens": 30, "temperature": 1.0, "seed": 3, "regex": regex},
            {"max_new_tokens": 30, "temperature": 0, "ebnf": ebnf},
            {"max_new_tokens": 30, "temperature": 0, "regex": regex2}])

    # also warms the masked executables of the steps this batch goes through
    outs = run(r"[0-9]{3}-[a-z]{2,4}", 'root ::= ("yes" | "no") "!" [0-9]', r"(cat|dog)s?")
    compiles = dict(engine.stepper.num_compiles)  # the fused step and, under overlap, the split one
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2,4}", outs[0]["text"]), outs[0]["text"]
    assert re.fullmatch(r"(yes|no)![0-9]", outs[1]["text"]), outs[1]["text"]
    assert re.fullmatch(r"(cat|dog)s?", outs[2]["text"]), outs[2]["text"]
    # new grammar texts of the same languages: the same outputs, hence the same step shapes
    again = run(r"([0-9]{3}-[a-z]{2,4})", 'root ::= ("yes" | "no") ("!") [0-9]', r"((cat|dog)s?)")
    assert [o["text"] for o in again] == [o["text"] for o in outs]
    assert engine.stepper.num_compiles == compiles  # new grammars are new mask data, not new programs


def test_unconstrained_rows_beside_a_grammar_are_unchanged(engine):
    plain = engine.generate("The quick brown fox", {"temperature": 0, "max_new_tokens": 12})
    mixed = engine.generate(["The quick brown fox", "Hello"], [
        {"temperature": 0, "max_new_tokens": 12},
        {"temperature": 0, "max_new_tokens": 12, "regex": "[a-z]+"}])
    assert mixed[0]["output_ids"] == plain["output_ids"]


def test_bad_grammar_is_refused_and_nothing_is_queued(engine):
    with pytest.raises(InvalidSamplingParamsError, match="regex is not a valid grammar"):
        engine.generate(["a", "b"], [{"regex": "a+"}, {"regex": "(unclosed"}])
    assert engine.scheduler.idle
    off = Engine(model=engine.model, tokenizer=engine.tokenizer, grammar_backend="none", **FLAGS)
    with pytest.raises(InvalidRequestError, match="grammar-backend"):
        off.submit("x", sampling_params={"regex": "a+"})


@pytest.fixture(scope="module")
def spec_engine():
    # a round every decode step: the tests below measure what constrained rounds accept
    return Engine(model_path=str(EMBEDDED_MODEL_DIR), speculative_algorithm="EAGLE3",
                  speculative_draft_model_path=str(EMBEDDED_MODEL_DIR / "draft"), speculative_policy="always",
                  **FLAGS)


@pytest.mark.slow
def test_constrained_outputs_equal_with_and_without_eagle3_and_drafts_are_accepted(engine, spec_engine):
    """JSON schema, regex and EBNF, greedy and seeded: the EAGLE-3 engine's tokens are the plain engine's
    (its grammar walk masks every verified position; constrained rows match the plain sampler's draws),
    and constrained rounds accept drafts (more than one token per round)."""
    schema = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[a-z]{0,8}$"},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["name", "age"], "additionalProperties": False}
    ebnf = 'root ::= ("yes" | "no") " " [a-z ]+'
    params = [{"temperature": 0, "max_new_tokens": 40, "json_schema": json.dumps(schema)},
              {"temperature": 0, "max_new_tokens": 24, "regex": "[0-9]{3}-[a-z]+"},
              {"temperature": 0, "max_new_tokens": 30, "ebnf": ebnf},
              {"temperature": 0.8, "seed": 7, "max_new_tokens": 40, "json_schema": json.dumps(schema)},
              {"temperature": 1.0, "seed": 5, "max_new_tokens": 30, "regex": "[a-z ]+"},
              {"temperature": 0, "max_new_tokens": 24}]  # unconstrained beside them
    prompts = ["Hello", "The quick brown fox", "def main():", "Question:", "Once upon a time", "def main():"]
    plain = [o["output_ids"] for o in engine.generate(prompts, params)]
    outs = spec_engine.generate(prompts, params)
    assert [o["output_ids"] for o in outs] == plain
    json.loads(outs[0]["text"])
    assert re.fullmatch(r"[0-9]{3}-[a-z]+", outs[1]["text"]), outs[1]["text"]
    assert re.fullmatch(r"(yes|no) [a-z ]+", outs[2]["text"]), outs[2]["text"]
    # constrained (greedy and seeded) rounds accept drafts: tokens per round well above one (a round that
    # verified no draft, as before the grammar walk, gave ~1.05: only the prefill's token is extra)
    for i in (0, 2, 3):
        assert outs[i]["meta_info"]["spec_accept_length"] > 1.5, (i, outs[i]["meta_info"])
    assert outs[5]["meta_info"]["spec_accept_length"] > 1.5


@pytest.mark.slow
@settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(schemas=st.lists(SCHEMAS, min_size=8, max_size=8), temperature=st.sampled_from([0.0, 1.0]))
def test_random_schema_outputs_equal_with_and_without_eagle3(engine, spec_engine, schemas, temperature):
    """Greedy or seeded: the EAGLE-3 engine's outputs are the plain engine's, and every one validates."""
    params = [{"json_schema": json.dumps(s), "temperature": temperature, "seed": i, "max_new_tokens": 200}
              for i, s in enumerate(schemas)]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(schemas))]
    plain = engine.generate(prompts, params)
    spec = spec_engine.generate(prompts, params)
    assert [o["output_ids"] for o in spec] == [o["output_ids"] for o in plain]
    for schema, out in zip(schemas, spec, strict=True):
        assert out["meta_info"]["finish_reason"]["type"] == "stop", (schema, out["text"])
        jsonschema.validate(json.loads(out["text"]), schema)


# --------------------------------------------------------------------------- xgrammar (--grammar-backend)
@pytest.fixture(scope="module")
def xg_engine(engine):
    """The plain engine's model under the xgrammar backend (same graph: its compiled programs are shared)."""
    return Engine(model=engine.model, tokenizer=engine.tokenizer, grammar_backend="xgrammar", **FLAGS)


@pytest.fixture(scope="module")
def xg_spec_engine(spec_engine):
    return Engine(model=spec_engine.model, tokenizer=spec_engine.tokenizer, grammar_backend="xgrammar",
                  draft_model=load_draft(spec_engine.args), speculative_algorithm="EAGLE3",
                  speculative_draft_model_path=spec_engine.args.speculative_draft_model_path,
                  speculative_policy="always", **FLAGS)


@pytest.mark.slow
def test_xgrammar_outputs_match_equal_under_eagle3_and_compile_nothing_new(xg_engine, xg_spec_engine):
    """JSON schema, regex and EBNF under xgrammar, greedy and seeded: outputs are in their languages, the
    EAGLE-3 engine's tokens are the plain engine's with drafts accepted, and new grammars are new mask data,
    not new programs."""
    schema = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[a-z]{0,8}$"},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["name", "age"], "additionalProperties": False}
    params = [{"temperature": 0, "max_new_tokens": 40, "json_schema": json.dumps(schema)},
              {"temperature": 0, "max_new_tokens": 24, "regex": "[0-9]{3}-[a-z]+"},
              {"temperature": 0, "max_new_tokens": 30, "ebnf": 'root ::= ("yes" | "no") " " [a-z ]+'},
              {"temperature": 0.8, "seed": 7, "max_new_tokens": 40, "json_schema": json.dumps(schema)},
              {"temperature": 1.0, "seed": 5, "max_new_tokens": 30, "regex": "(cat|dog)s?"},
              {"temperature": 0, "max_new_tokens": 24}]  # unconstrained beside them
    prompts = ["Hello", "The quick brown fox", "def main():", "Question:", "Once upon a time", "def main():"]
    plain = xg_engine.generate(prompts, params)
    for i in (0, 3):
        assert plain[i]["meta_info"]["finish_reason"]["type"] == "stop", plain[i]["text"]
        jsonschema.validate(json.loads(plain[i]["text"]), schema)
    assert re.fullmatch(r"[0-9]{3}-[a-z]+", plain[1]["text"]), plain[1]["text"]
    assert re.fullmatch(r"(yes|no) [a-z ]+", plain[2]["text"]), plain[2]["text"]
    assert re.fullmatch(r"(cat|dog)s?", plain[4]["text"]), plain[4]["text"]
    spec = xg_spec_engine.generate(prompts, params)
    assert [o["output_ids"] for o in spec] == [o["output_ids"] for o in plain]
    for i in (0, 2, 3):
        assert spec[i]["meta_info"]["spec_accept_length"] > 1.5, (i, spec[i]["meta_info"])
    compiles = dict(xg_engine.stepper.num_compiles)
    renamed = [{**params[0], "json_schema": json.dumps(schema, indent=1)},
               {**params[1], "regex": "([0-9]{3}-[a-z]+)"},
               {**params[2], "ebnf": 'root ::= ("yes" | "no") (" ") [a-z ]+'}, *params[3:]]
    again = xg_engine.generate(prompts, renamed)  # the same batch: the same step shapes
    assert [o["output_ids"] for o in again] == [o["output_ids"] for o in plain]
    assert xg_engine.stepper.num_compiles == compiles


@pytest.mark.slow
@settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(schemas=st.lists(SCHEMAS, min_size=12, max_size=12), temperature=st.sampled_from([0.0, 1.0]))
def test_xgrammar_random_schema_outputs_validate_and_equal_under_eagle3(xg_engine, xg_spec_engine, schemas,
                                                                         temperature):
    params = [{"json_schema": json.dumps(s), "temperature": temperature, "seed": i, "max_new_tokens": 200}
              for i, s in enumerate(schemas)]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(schemas))]
    plain = xg_engine.generate(prompts, params)
    for schema, out in zip(schemas, plain, strict=True):
        assert out["meta_info"]["finish_reason"]["type"] == "stop", (schema, out["text"])
        jsonschema.validate(json.loads(out["text"]), schema)
    spec = xg_spec_engine.generate(prompts, params)
    assert [o["output_ids"] for o in spec] == [o["output_ids"] for o in plain]
