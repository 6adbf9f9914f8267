"""Constrained decoding with llguidance: grammars from JSON schemas, regexes and EBNF/Lark, and per-request
matchers that give each step's token bitmask (host side, numpy; the mask is applied on device by
`constraints.apply_token_bitmask`, as data).

A `GrammarBackend` wraps one tokenizer. `compile(kind, source)` builds a fresh matcher for a grammar
(cached by grammar text, so that the server can compile on a worker thread before the request reaches the
engine thread, which then only copies it); `matcher(kind, source)` hands a request its own copy. A
`GrammarMatcher` is the request's grammar state: `fill(mask_row)` writes the tokens allowed next, `advance`
consumes an output token, `rollback` undoes the last consumed tokens (speculative decoding walks drafts).
Masks are `u32[rows, ceil(V / 32)]`, bit j of word w = token 32 w + j, V the model's vocabulary (ids the
tokenizer lacks are never allowed).
"""

from __future__ import annotations

import collections
import json
import threading
from collections.abc import Iterable, Sequence
from typing import Protocol

import numpy as np

from jaxserve.memory.host_buffers import aligned_full
from jaxserve.sampling.errors import InvalidSamplingParamsError
from jaxserve.sampling.params import GRAMMAR_KINDS

GRAMMAR_BACKENDS = ("llguidance", "xgrammar", "none")  # xgrammar: an optional extra (it imports torch)
_CACHE_SIZE = 256  # compiled grammars kept (LRU)
# JSON output laid out as json.dumps does, no other whitespace: a small model cannot pad it with blanks
# forever (flexible whitespace lets it)
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarState(Protocol):
    """What a request's grammar is to the engine, whichever backend made it (`GrammarMatcher` here,
    `grammar_xgrammar.XGrammarMatcher`)."""

    num_words: int

    def fill(self, bitmask: np.ndarray, row: int) -> None: ...

    def advance(self, token_id: int) -> None: ...

    def rollback(self, num_tokens: int) -> None: ...

    @property
    def stopped(self) -> bool: ...

    @property
    def error(self) -> str | None: ...


class ConstraintBackend(Protocol):
    """A grammar library over one tokenizer: `compile(kind, source)` checks and caches a grammar (a kind of
    GRAMMAR_KINDS; InvalidSamplingParamsError naming what is wrong), `matcher` hands a request its own state.
    `num_words`: the mask width, ceil(V / 32)."""

    num_words: int

    def compile(self, kind: str, source: str) -> None: ...

    def matcher(self, kind: str, source: str) -> GrammarState: ...


def make_grammar_backend(name: str, tokenizer_json: str, vocab_size: int,
                         eos_token_ids: Iterable[int]) -> ConstraintBackend | None:
    """The backend `name` ("llguidance", "xgrammar" or "none": None) over a tokenizer.json text."""
    if name == "none":
        return None
    if name == "llguidance":
        return GrammarBackend(tokenizer_json, vocab_size, eos_token_ids)
    if name == "xgrammar":
        from jaxserve.sampling.grammar_xgrammar import XGrammarBackend

        return XGrammarBackend(tokenizer_json, vocab_size, eos_token_ids)
    raise ValueError(f"grammar backend {name!r}; choose one of {', '.join(GRAMMAR_BACKENDS)}")


def check_mask_row(bitmask: np.ndarray, row: int) -> None:
    """ValueError unless `bitmask` is a writeable C-contiguous u32[rows, words] array, IndexError unless
    `row` is one of its rows: a backend writes a row through its address, so it must not be anything else."""
    flags = bitmask.flags
    if bitmask.dtype != np.uint32 or bitmask.ndim != 2 or not (flags.c_contiguous and flags.writeable):
        raise ValueError(f"a mask is a writeable C-contiguous u32[rows, words] array, not {bitmask.dtype}"
                         f"{list(bitmask.shape)}")
    if not 0 <= row < bitmask.shape[0]:
        raise IndexError(f"row {row} of a mask of {bitmask.shape[0]} rows")


class GrammarMatcher:
    """One request's grammar state. Not thread-safe: the engine thread owns it once submitted."""

    def __init__(self, matcher, num_words: int) -> None:
        self._matcher = matcher
        self.num_words = num_words

    def fill(self, bitmask: np.ndarray, row: int) -> None:
        """Write the tokens allowed next into `bitmask[row]` (u32[rows, num_words]: C-contiguous and
        writeable, else ValueError; a row out of range: IndexError)."""
        check_mask_row(bitmask, row)
        # llguidance writes the row through its address (what its numpy helper does, minus a view and a slice)
        row_bytes = bitmask.shape[1] * 4
        self._matcher.unsafe_compute_mask_ptr(bitmask.ctypes.data + row * row_bytes, row_bytes)

    def advance(self, token_id: int) -> None:
        """Consume an output token (one the mask allowed). A token it forbids - impossible when the mask was
        applied - leaves the matcher in its error state, reported by `error`."""
        self._matcher.consume_token(token_id)

    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` consumed tokens (the state is then as before them)."""
        if num_tokens:
            self._matcher.rollback(num_tokens)

    @property
    def stopped(self) -> bool:
        """Whether the grammar has ended (it then allows nothing more but the end of the output)."""
        return self._matcher.is_stopped()

    @property
    def error(self) -> str | None:
        return self._matcher.get_error() if self._matcher.is_error() else None


def fill_bitmask(matchers: Sequence[GrammarState | None], num_rows: int | None = None) -> np.ndarray | None:
    """u32[num_rows, W] (num_rows defaults to len(matchers)): row i < len(matchers) the tokens matcher i
    allows next (all tokens for None), the rows past them all tokens; None when no row has a matcher (the
    step then keeps its unconstrained executable). One buffer, filled in place, that a step's sampling batch
    takes as it is."""
    present = [m for m in matchers if m is not None]
    if not present:
        return None
    mask = aligned_full((len(matchers) if num_rows is None else num_rows, present[0].num_words), 0xFFFFFFFF,
                        np.uint32)  # a large vocabulary's mask then reaches a CPU step uncopied
    for row, matcher in enumerate(matchers):
        if matcher is not None:
            matcher.fill(mask, row)
    return mask


class GrammarBackend:
    """llguidance over one tokenizer (`tokenizer_json`: the tokenizer.json text) for a model of
    `vocab_size` logits; `eos_token_ids`: what ends a finished grammar. Thread-safe."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_token_ids: Iterable[int]) -> None:
        import llguidance

        eos = sorted(eos_token_ids)
        self._llg = llguidance
        self._tokenizer = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size,
                                                 eos_token=eos if eos else None)
        self.num_words = -(-vocab_size // 32)
        self._cache: collections.OrderedDict[tuple[str, str], object] = collections.OrderedDict()
        self._lock = threading.Lock()

    def _grammar_text(self, kind: str, source: str) -> str:
        matcher_cls = self._llg.LLMatcher
        try:
            if kind == "json_schema":
                return matcher_cls.grammar_from_json_schema(json.loads(source), defaults=JSON_LAYOUT)
            if kind == "regex":
                return matcher_cls.grammar_from_regex(source)
            if kind == "ebnf":
                return self._llg.grammar_from("ebnf", source)
            if kind == "lark":
                return self._llg.grammar_from("lark", source)
        except (ValueError, TypeError, RuntimeError) as exc:  # malformed JSON, a grammar llguidance rejects
            raise InvalidSamplingParamsError(f"{kind} is not a valid grammar: {exc}") from None
        raise InvalidSamplingParamsError(f"unknown grammar kind {kind!r}; use one of "
                                         f"{', '.join(GRAMMAR_KINDS)}")

    def compile(self, kind: str, source: str) -> None:
        """Compile (and cache) the grammar; raises InvalidSamplingParamsError naming what is wrong. Cost: up
        to about a second for very large grammars; call off the engine thread when it matters."""
        self._template(kind, source)

    def matcher(self, kind: str, source: str) -> GrammarMatcher:
        """A fresh matcher for the grammar (compiled now if not cached)."""
        template = self._template(kind, source)
        with self._lock:
            return GrammarMatcher(template.deep_copy(), self.num_words)

    def _template(self, kind: str, source: str):
        key = (kind, source)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        matcher = self._llg.LLMatcher(self._tokenizer, self._grammar_text(kind, source), log_level=0)
        if matcher.is_error():
            raise InvalidSamplingParamsError(f"{kind} is not a valid grammar: {matcher.get_error()}")
        with self._lock:
            self._cache[key] = matcher
            while len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
        return matcher
