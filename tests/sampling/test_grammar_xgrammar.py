"""The xgrammar backend (`--grammar-backend xgrammar`) on the embedded tokenizer. Its masks are judged by a
brute-force reading of the vocabulary: a token is allowed exactly when the text so far plus the token's text
can still be completed to a string of the regex (the `regex` package's partial matching), the end of
sequence exactly when the text is one. Special tokens are never text; the contract our engine relies on
(stopped, rollback, error state, bad buffers refused, bad grammars named) holds as for llguidance."""

from __future__ import annotations

import json

import numpy as np
import pytest
import regex
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxserve.assets import EMBEDDED_MODEL_DIR
from jaxserve.engine.config import ServerArgs
from jaxserve.loader.tokenizer import HFTokenizer
from jaxserve.sampling.errors import InvalidSamplingParamsError
from jaxserve.sampling.grammar import fill_bitmask, make_grammar_backend
from jaxserve.sampling.grammar_xgrammar import XGrammarBackend

VOCAB = 1024
REGEXES = [r"[0-9]+", r"(cat|dog)s?", r"[a-z ]{3,30}\.", r"[0-9]{3}-[a-z]{2,4}", r"(yes|no)![0-9]",
           r"a(b|cd)*e"]


@pytest.fixture(scope="module")
def tok():
    return HFTokenizer(EMBEDDED_MODEL_DIR)


@pytest.fixture(scope="module")
def backend(tok):
    return XGrammarBackend(tok.to_json(), VOCAB, tok.eos_token_ids)


@pytest.fixture(scope="module")
def texts(tok):
    """Each token's text, None for special tokens (the tokenizer's special added tokens)."""
    special = {i for i in range(VOCAB) if tok.decode([i], skip_special_tokens=True) == ""
               and tok.decode([i], skip_special_tokens=False) != ""}
    return [None if i in special else tok.decode([i], skip_special_tokens=False) for i in range(VOCAB)]


def _allowed(mask_row: np.ndarray) -> set[int]:
    bits = np.unpackbits(mask_row.view(np.uint8), bitorder="little")[:VOCAB]
    return set(np.nonzero(bits)[0].tolist())


def _brute_force(pattern: str, text: str, texts: list[str | None], eos: set[int]) -> set[int]:
    """Tokens after which `text` can still become a string of `pattern`, and the end of sequence if it is
    one already."""
    allowed = {i for i, t in enumerate(texts)
               if t and i not in eos and regex.fullmatch(pattern, text + t, partial=True) is not None}
    return allowed | (eos if regex.fullmatch(pattern, text) else set())


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(pattern=st.sampled_from(REGEXES), picks=st.lists(st.integers(0, 10**6), min_size=1, max_size=12))
def test_regex_masks_equal_a_brute_force_reading_along_random_walks(backend, tok, texts, pattern, picks):
    eos = set(tok.eos_token_ids)
    matcher, text = backend.matcher("regex", pattern), ""
    for pick in picks:
        expected = _brute_force(pattern, text, texts, eos)
        assert _allowed(fill_bitmask([matcher])[0]) == expected, (pattern, text)
        token = sorted(expected)[pick % len(expected)]
        matcher.advance(token)
        assert matcher.error is None
        if token in eos:
            assert matcher.stopped  # then only the end of sequence is allowed
            assert _allowed(fill_bitmask([matcher])[0]) == eos
            return
        text += texts[token]
        assert not matcher.stopped


def test_special_tokens_are_never_text_and_eos_ends_only_a_whole_value(backend, tok, texts):
    special = {i for i, t in enumerate(texts) if t is None}
    eos = set(tok.eos_token_ids)
    assert special - eos  # the embedded tokenizer has special tokens besides its end of sequence
    schema = json.dumps({"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]})
    matcher = backend.matcher("json_schema", schema)
    for token in tok.encode('{"s": "ab', add_special_tokens=False):
        matcher.advance(token)
    inside = _allowed(fill_bitmask([matcher])[0])
    assert inside and not inside & special and not inside & eos  # inside a string: text, never specials
    for token in tok.encode('"}', add_special_tokens=False):
        matcher.advance(token)
    assert _allowed(fill_bitmask([matcher])[0]) == eos and matcher.error is None


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(pattern=st.sampled_from(REGEXES), picks=st.lists(st.integers(0, 10**6), min_size=1, max_size=8),
       undo=st.integers(0, 8))
def test_rollback_restores_the_state_before_the_undone_tokens(backend, pattern, picks, undo):
    matcher, masks = backend.matcher("regex", pattern), []
    for pick in picks:
        masks.append(fill_bitmask([matcher])[0].copy())
        allowed = sorted(_allowed(masks[-1]))
        matcher.advance(allowed[pick % len(allowed)])
        if matcher.stopped:
            break
    undo = min(undo, len(masks))
    matcher.rollback(undo)
    after = fill_bitmask([matcher])[0]
    if undo:
        assert np.array_equal(after, masks[-undo])
    assert not matcher.stopped or undo == 0


def test_a_forbidden_token_is_an_error_until_rolled_back(backend, tok):
    matcher = backend.matcher("regex", "[0-9]+")
    before = fill_bitmask([matcher])[0].copy()
    letter = tok.encode("x", add_special_tokens=False)[0]
    matcher.advance(letter)
    assert matcher.error is not None and "not allowed" in matcher.error
    assert _allowed(fill_bitmask([matcher])[0]) == set(tok.eos_token_ids)  # an errored row can only end
    matcher.rollback(1)
    assert matcher.error is None and np.array_equal(fill_bitmask([matcher])[0], before)


def test_ends_after_the_end_change_nothing_and_roll_back(backend, tok):
    """With ignore_eos a request goes on after its grammar ended: more end-of-sequence tokens are no error,
    anything else is; rolling back past them returns to the grammar's last state."""
    [eos] = tok.eos_token_ids
    matcher = backend.matcher("regex", "ab")
    for token in tok.encode("ab", add_special_tokens=False):
        matcher.advance(token)
    before_end = fill_bitmask([matcher])[0].copy()
    assert _allowed(before_end) == {eos}
    for _ in range(3):
        matcher.advance(eos)
        assert matcher.stopped and matcher.error is None and _allowed(fill_bitmask([matcher])[0]) == {eos}
    matcher.advance(tok.encode("x", add_special_tokens=False)[0])
    assert matcher.error is not None
    matcher.rollback(1)
    assert matcher.error is None and matcher.stopped
    matcher.rollback(3)
    assert not matcher.stopped and np.array_equal(fill_bitmask([matcher])[0], before_end)


@pytest.mark.parametrize("kind,source,message", [
    ("json_schema", "{not json", "json_schema is not a valid grammar: Expecting property name"),
    ("regex", "(unclosed", "regex is not a valid grammar: Regex parsing error"),
    ("ebnf", "root ::= (", "ebnf is not a valid grammar: EBNF parser error"),
    ("lark", "start: (", "lark is not a valid grammar"),
    ("gbnf", "root ::= x", "unknown grammar kind"),
])
def test_bad_grammars_are_named_without_xgrammars_source_location(backend, kind, source, message):
    with pytest.raises(InvalidSamplingParamsError, match=message) as info:
        backend.compile(kind, source)
    assert ".cc:" not in str(info.value)


def test_lark_grammars_go_to_llguidance_with_the_same_contract(backend, tok, texts):
    """The `lark` kind (what tool_choice enforcement is written in) under the xgrammar backend: its masks
    allow exactly the tokens that keep the text a prefix of the grammar's strings."""
    matcher, text = backend.matcher("lark", 'start: "yes" | "no" | "maybe"'), ""
    words = ("yes", "no", "maybe")
    while not matcher.stopped:
        allowed = _allowed(fill_bitmask([matcher])[0])
        expected = {i for i, t in enumerate(texts) if t and any(w.startswith(text + t) for w in words)}
        assert allowed - set(tok.eos_token_ids) <= expected and allowed, text
        token = min(allowed - set(tok.eos_token_ids), default=None)
        if token is None:
            break
        matcher.advance(token)
        text += texts[token]
    assert text in words


def test_the_backend_is_chosen_by_name_and_a_missing_package_is_named(tok, monkeypatch):
    assert make_grammar_backend("none", tok.to_json(), VOCAB, tok.eos_token_ids) is None
    chosen = make_grammar_backend("xgrammar", tok.to_json(), VOCAB, tok.eos_token_ids)
    assert isinstance(chosen, XGrammarBackend)
    with pytest.raises(ValueError, match="grammar backend 'outlines'"):
        make_grammar_backend("outlines", tok.to_json(), VOCAB, tok.eos_token_ids)
    assert ServerArgs.from_kwargs({"grammar_backend": "xgrammar"}).grammar_backend == "xgrammar"
    with pytest.raises(ValueError, match="choose one of llguidance, xgrammar, none"):
        ServerArgs.from_kwargs({"grammar_backend": "outlines"})
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "xgrammar" else real_find_spec(name, *a))
    with pytest.raises(ValueError, match=r"pip install 'jaxserve\[xgrammar\]'"):
        ServerArgs.from_kwargs({"grammar_backend": "xgrammar"})
