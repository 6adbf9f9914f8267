"""Constrained decoding under EAGLE-3 on a tiny Llama (byte tokenizer, the `copy_pair` draft): the speculative
engine's outputs equal the plain engine's under the same grammars (JSON schema, regex, EBNF; greedy and
seeded), and constrained rounds accept drafts, with chains and with trees."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from jaxserve.loader.tokenizer import HFTokenizer
from tests.engine.conftest import write_byte_tokenizer
from tests.speculative import spec_pairs as sp

pytestmark = pytest.mark.slow  # builds engines

SCHEMA = {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "name": {"type": "string", "pattern": "^[a-z]{1,6}$"}},
          "required": ["id", "name"], "additionalProperties": False}
PARAMS = [{"temperature": 0, "max_new_tokens": 40, "json_schema": json.dumps(SCHEMA)},
          {"temperature": 0, "max_new_tokens": 24, "regex": "[a-z]{3,}( [a-z]+)*"},
          {"temperature": 0, "max_new_tokens": 24, "ebnf": 'root ::= ("on" | "off") "=" [a-z]+'},
          {"temperature": 1.0, "seed": 11, "max_new_tokens": 24, "regex": "[a-z]+"},
          {"temperature": 0.7, "seed": 3, "max_new_tokens": 40, "json_schema": json.dumps(SCHEMA)},
          {"temperature": 0, "max_new_tokens": 16},
          {"temperature": 0.9, "seed": 4, "frequency_penalty": 0.8, "presence_penalty": 0.3,
           "max_new_tokens": 24, "regex": "[a-z ]+"}]  # penalties count the drafted path
PROMPTS = [[5, 9, 33, 71], [100, 101, 102], [7, 7, 7, 7, 7], [200, 13], [64, 65, 66, 67], [1, 2, 3], [9, 8]]


@pytest.fixture(scope="module")
def tokenizer():
    path = Path(tempfile.mkdtemp(prefix="spec_grammar_tok_"))
    write_byte_tokenizer(path)
    return HFTokenizer(path)


@pytest.fixture(scope="module")
def plain(tokenizer):
    """The plain engine's outputs: the reference."""
    engine = sp.engine("llama", which=None, tokenizer=tokenizer)
    return [o["output_ids"] for o in engine.generate(input_ids=PROMPTS, sampling_params=PARAMS)]


def test_constrained_outputs_equal_plain_engine_and_accept_drafts(tokenizer, plain):
    spec = sp.engine("llama", tokenizer=tokenizer).generate(input_ids=PROMPTS, sampling_params=PARAMS)
    assert [o["output_ids"] for o in spec] == plain
    for i in (0, 4):
        assert json.loads(spec[i]["text"]).keys() == {"id", "name"}, spec[i]["text"]
    # constrained rounds accept drafts: tokens per round pooled over the constrained requests (a round that
    # verified no draft gives 1 + 1 / rounds, the extra token being the prefill's)
    infos = [o["meta_info"] for o in spec[:5]]
    tokens = sum(i["completion_tokens"] for i in infos)
    assert tokens / sum(i["spec_verify_ct"] for i in infos) > 1.5, [i["spec_accept_lengths"] for i in infos]



def test_tree_drafting_constrained_outputs_equal_plain_engine(tokenizer, plain):
    engine = sp.engine("llama", tokenizer=tokenizer, num_steps=3, speculative_eagle_topk=2,
                       speculative_num_draft_tokens=5)
    outs = engine.generate(input_ids=PROMPTS, sampling_params=PARAMS)
    assert [o["output_ids"] for o in outs] == plain
    infos = [o["meta_info"] for o in outs[:5]]
    tokens = sum(i["completion_tokens"] for i in infos)
    assert tokens / sum(i["spec_verify_ct"] for i in infos) > 1.5, [i["spec_accept_lengths"] for i in infos]
