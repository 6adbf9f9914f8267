"""Both grammar backends (llguidance, xgrammar) and `fill_bitmask` on the embedded tokenizer: masks against a
brute-force reading of the vocabulary, bad grammars named, matchers independent. The xgrammar backend's own
rules are in test_grammar_xgrammar.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

from jaxserve.assets import EMBEDDED_MODEL_DIR
from jaxserve.loader.tokenizer import HFTokenizer
from jaxserve.sampling.errors import InvalidSamplingParamsError
from jaxserve.sampling.grammar import fill_bitmask, make_grammar_backend

VOCAB = 1024


@pytest.fixture(scope="module")
def tok():
    return HFTokenizer(EMBEDDED_MODEL_DIR)


@pytest.fixture(scope="module", params=["llguidance", "xgrammar"])
def backend(tok, request):
    return make_grammar_backend(request.param, tok.to_json(), VOCAB, tok.eos_token_ids)


def _allowed(mask_row: np.ndarray) -> set[int]:
    bits = np.unpackbits(mask_row.view(np.uint8), bitorder="little")[:VOCAB]
    return set(np.nonzero(bits)[0].tolist())


def test_regex_mask_is_every_token_of_digits(backend, tok):
    matcher = backend.matcher("regex", "[0-9]+")
    mask = fill_bitmask([None, matcher])
    assert mask.shape == (2, VOCAB // 32) and mask.dtype == np.uint32
    assert _allowed(mask[0]) == set(range(VOCAB))  # a row without a grammar allows everything
    texts = {i: tok.decode([i], skip_special_tokens=False) for i in range(VOCAB)}
    digits = {i for i, t in texts.items() if t and all(c in "0123456789" for c in t)}
    assert digits and _allowed(mask[1]) == digits
    padded = fill_bitmask([None, matcher], num_rows=4)  # a step's rows past its sequences allow everything
    assert padded.shape == (4, VOCAB // 32) and np.array_equal(padded[:2], mask)
    assert all(_allowed(row) == set(range(VOCAB)) for row in padded[2:])
    matcher.advance(min(digits))
    after = fill_bitmask([matcher])[0]
    assert _allowed(after) == digits | set(tok.eos_token_ids)  # "[0-9]+" may end after one digit


def test_fill_refuses_a_buffer_it_would_write_out_of(backend):
    """`fill` writes through the row's address: a wrong dtype, layout or row is refused, not written."""
    matcher = backend.matcher("regex", "[0-9]+")
    words = VOCAB // 32
    frozen = np.zeros((2, words), np.uint32)
    frozen.flags.writeable = False
    for bad in (np.zeros((2, words), np.int64), np.zeros((2, 2 * words), np.uint32)[:, ::2],
                np.zeros(words, np.uint32), frozen):
        with pytest.raises(ValueError):
            matcher.fill(bad, 0)
    with pytest.raises(IndexError):
        matcher.fill(np.zeros((2, words), np.uint32), 2)


def test_no_matcher_means_no_mask():
    assert fill_bitmask([None, None]) is None


def test_matchers_of_one_grammar_are_independent(backend, tok):
    schema = json.dumps({"type": "boolean"})
    a, b = backend.matcher("json_schema", schema), backend.matcher("json_schema", schema)
    a.advance(tok.encode("t", add_special_tokens=False)[0])
    assert _allowed(fill_bitmask([a])[0]) != _allowed(fill_bitmask([b])[0])


@pytest.mark.parametrize("kind,source,message", [
    ("json_schema", "{not json", "json_schema is not a valid grammar"),
    ("json_schema", json.dumps({"type": "nonsense"}), "nonsense"),
    ("regex", "(unclosed", "regex is not a valid grammar"),
    ("ebnf", "root ::= (", "ebnf is not a valid grammar"),
])
def test_bad_grammars_are_named(backend, kind, source, message):
    with pytest.raises(InvalidSamplingParamsError, match=message):
        backend.compile(kind, source)
