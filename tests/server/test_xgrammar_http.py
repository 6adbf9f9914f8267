"""`--grammar-backend xgrammar` (SGLang's default grammar library, our optional extra) on the main job's
setup - the embedded target with its EAGLE-3 head and the radix cache - through the official `openai`
client: response_format json_schema (whole and streamed), SGLang's regex / ebnf extras, our `lark`
(compiled by llguidance under either backend) and a bad grammar's 400. Greedy outputs equal an in-process
plain (non-speculative) engine under the same backend, so the grammar walk along EAGLE-3's drafts is
lossless through the whole HTTP path."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest

from jaxserve.assets import EMBEDDED_DRAFT_DIR, EMBEDDED_MODEL_DIR
from tests.server.conftest import ENGINE_FLAGS, ServerProcess, assert_kv_baseline, flags_of

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "pattern": "^[A-Za-z]{1,10}$"},
                                           "population": {"type": "integer", "minimum": 0, "maximum": 999}},
          "required": ["city", "population"], "additionalProperties": False}


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess(["--model-path", str(EMBEDDED_MODEL_DIR), *flags_of(ENGINE_FLAGS),
                          "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
                          str(EMBEDDED_DRAFT_DIR), "--speculative-policy", "always",
                          "--grammar-backend", "xgrammar"])
    yield proc
    assert proc.stop() == 0, "".join(proc.stderr[-30:])


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def client(server):
    import httpx

    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def plain():
    from jaxserve.api import Engine

    return Engine(model_path=str(EMBEDDED_MODEL_DIR), grammar_backend="xgrammar", **ENGINE_FLAGS)


def test_completions_under_each_grammar_kind_equal_plain_decoding(oai, client, plain):
    cases = [("Data:", {"json_schema": json.dumps(SCHEMA)}, 60),
             ("Phone:", {"regex": r"\d{3}-\d{4}"}, 20),
             ("Answer:", {"ebnf": 'root ::= ("yes" | "no") " " [a-z ]+'}, 24),
             ("Answer:", {"lark": 'start: ("yes" | "no") "!"'}, 8)]  # llguidance's, under xgrammar too
    texts = []
    for prompt, grammar, max_tokens in cases:
        out = oai.completions.create(model="any", prompt=prompt, max_tokens=max_tokens, temperature=0,
                                     extra_body=grammar)
        expected = plain.generate(prompt, {"temperature": 0, "max_new_tokens": max_tokens, **grammar})
        assert out.choices[0].text == expected["text"], grammar
        texts.append(out.choices[0].text)
    jsonschema.validate(json.loads(texts[0]), SCHEMA)
    assert re.fullmatch(r"\d{3}-\d{4}", texts[1]), texts[1]
    assert re.fullmatch(r"(yes|no) [a-z ]+", texts[2]), texts[2]
    assert texts[3] in ("yes!", "no!"), texts[3]
    assert_kv_baseline(client)


def test_chat_json_schema_whole_and_streamed(oai, client):
    kwargs = dict(model="any", messages=[{"role": "user", "content": "Name a city."}], max_tokens=60,
                  temperature=1.0, seed=3,
                  response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}})
    whole = oai.chat.completions.create(**kwargs)
    assert whole.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(whole.choices[0].message.content), SCHEMA)
    chunks = list(oai.chat.completions.create(**kwargs, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        whole.choices[0].message.content
    assert_kv_baseline(client)


def test_a_bad_grammar_is_a_400_that_names_it(oai, client):
    with pytest.raises(openai.BadRequestError, match="regex is not a valid grammar: Regex parsing error"):
        oai.completions.create(model="any", prompt="x", max_tokens=4, extra_body={"regex": "(unclosed"})
    with pytest.raises(openai.BadRequestError, match="ebnf is not a valid grammar"):
        oai.completions.create(model="any", prompt="x", max_tokens=4, extra_body={"ebnf": "root ::= ("})
    assert client.get("/health_generate").status_code == 200
    assert_kv_baseline(client)
