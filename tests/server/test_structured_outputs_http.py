"""Structured outputs over HTTP with the official `openai` client (response_format json_schema and
json_object, SGLang's regex / ebnf extras) and SGLang's /generate (`json_schema`, `regex` sampling params)."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest

from tests.server.conftest import assert_kv_baseline

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "pattern": "^[A-Za-z]{1,10}$"},
                                           "population": {"type": "integer", "minimum": 0, "maximum": 999}},
          "required": ["city", "population"], "additionalProperties": False}


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_chat_json_schema_response_format(oai, client):
    out = oai.chat.completions.create(
        model="any", messages=[{"role": "user", "content": "Name a city."}], max_tokens=60, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}})
    jsonschema.validate(json.loads(out.choices[0].message.content), SCHEMA)
    assert out.choices[0].finish_reason == "stop"
    assert_kv_baseline(client)


def test_streamed_json_schema_equals_the_whole_answer(oai):
    kwargs = dict(model="any", messages=[{"role": "user", "content": "Give me JSON."}], max_tokens=60,
                  temperature=1.0, seed=2,
                  response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}})
    whole = oai.chat.completions.create(**kwargs).choices[0].message.content
    chunks = list(oai.chat.completions.create(**kwargs, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole
    jsonschema.validate(json.loads(whole), SCHEMA)


def test_json_object_mode_opens_an_object(oai):
    """Any JSON object: the tiny model rarely closes one within a few tokens, so this checks the start (the
    random-schema test in tests/engine checks that constrained outputs close and validate)."""
    out = oai.chat.completions.create(model="any", messages=[{"role": "user", "content": "JSON?"}],
                                      max_tokens=3, temperature=0, response_format={"type": "json_object"})
    assert out.choices[0].message.content.startswith("{")


def test_sglang_extras_regex_and_ebnf(oai, client):
    out = oai.completions.create(model="any", prompt="Phone:", max_tokens=20, temperature=0,
                                 extra_body={"regex": r"\d{3}-\d{4}"})
    assert re.fullmatch(r"\d{3}-\d{4}", out.choices[0].text)
    out = oai.completions.create(model="any", prompt="Answer:", max_tokens=20, temperature=0,
                                 extra_body={"ebnf": 'root ::= "yes" | "no"'})
    assert out.choices[0].text in ("yes", "no")
    r = client.post("/generate", json={"text": "Data:", "sampling_params": {
        "max_new_tokens": 60, "temperature": 0, "json_schema": json.dumps(SCHEMA)}})
    jsonschema.validate(json.loads(r.json()["text"]), SCHEMA)


def test_bad_grammars_are_a_400(oai, client):
    with pytest.raises(openai.BadRequestError, match="not a valid grammar"):
        oai.completions.create(model="any", prompt="x", max_tokens=4, extra_body={"regex": "(unclosed"})
    with pytest.raises(openai.BadRequestError, match=r"json_schema\.schema"):
        oai.chat.completions.create(model="any", messages=[{"role": "user", "content": "x"}], max_tokens=4,
                                    response_format={"type": "json_schema", "json_schema": {"name": "x"}})
    with pytest.raises(openai.BadRequestError, match="not both"):
        oai.completions.create(model="any", prompt="x", max_tokens=4,
                               extra_body={"regex": "a+", "response_format": {"type": "json_object"}})
    assert_kv_baseline(client)
