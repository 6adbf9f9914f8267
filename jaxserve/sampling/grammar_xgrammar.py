"""Constrained decoding with xgrammar, SGLang's default grammar backend: the same contract as the llguidance
backend (`jaxserve.sampling.grammar`), so that a server started with `--grammar-backend xgrammar` behaves as
an SGLang user expects. xgrammar is an optional extra (`pip install 'jaxserve[xgrammar]'`): it imports torch,
which the default backend keeps out of the serving runtime.

Where the two libraries differ, this module makes xgrammar follow our rules:
- Special tokens are never text. xgrammar treats a token as special only when its text is empty, so the
  vocabulary it is given has the tokenizer's special added tokens blanked; otherwise a JSON string could
  contain `<|start|>` (llguidance never allows them either). The end-of-sequence ids stay allowed where the
  grammar may end.
- JSON is laid out as `json.dumps` lays it out (", " and ": ", no other whitespace), as with llguidance: a
  small model cannot pad an object with blanks forever.
- A matcher that consumed an end-of-sequence token has ended (`stopped`); its mask then allows only the
  end-of-sequence ids (xgrammar itself refuses to compute a mask there), and more of them (a request with
  `ignore_eos` goes on) change nothing.
- A token the mask forbade (impossible when the mask was applied) puts the matcher in an error state
  reported by `error`, where xgrammar only returns False.
- Lark grammars (kind "lark", llguidance's format; `tool_choice` enforcement is written in it, with JSON
  schemas and harmony's special tokens inside) go to llguidance, a dependency either way; their matchers
  keep the same contract, so one batch may mix both libraries' masks.
Rollback has no bound in xgrammar 0.2 (speculative rounds roll back at most their draft length).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

import numpy as np

from jaxserve.sampling.errors import InvalidSamplingParamsError
from jaxserve.sampling.grammar import JSON_LAYOUT, GrammarBackend, GrammarMatcher, check_mask_row
from jaxserve.sampling.params import GRAMMAR_KINDS

_SEPARATORS = (JSON_LAYOUT["item_separator"], JSON_LAYOUT["key_separator"])
_SOURCE_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:[0-9]+: ")  # where in xgrammar's C++ an error was raised
_CACHE_BYTES = 256 << 20  # compiled grammars kept by xgrammar's own cache


class XGrammarMatcher:
    """One request's grammar state over an xgrammar matcher (`GrammarMatcher`'s contract). Not thread-safe:
    the engine thread owns it once submitted."""

    def __init__(self, matcher, num_words: int, stop_ids: frozenset[int], stop_words: np.ndarray) -> None:
        self._matcher = matcher
        self.num_words = num_words
        self._stop_ids = stop_ids  # the end-of-sequence ids, and their mask row u32[num_words]
        self._stop_words = stop_words
        self._error: str | None = None
        # tokens consumed that xgrammar did not see - an end after the end (ignore_eos lets a request go on
        # after its grammar ended), or any token from an error on - always the last ones consumed
        self._unseen = 0
        self._error_at = 0  # how many unseen tokens came before the one in error

    def fill(self, bitmask: np.ndarray, row: int) -> None:
        """Write the tokens allowed next into `bitmask[row]` (u32[rows, num_words], C-contiguous and
        writeable, else ValueError; a row out of range: IndexError)."""
        check_mask_row(bitmask, row)
        if self._error is not None or self._matcher.is_terminated():
            bitmask[row] = self._stop_words
        else:
            self._matcher.fill_next_token_bitmask(bitmask.view(np.int32), row)

    def advance(self, token_id: int) -> None:
        """Consume an output token (one the mask allowed); a forbidden one leaves the matcher in its error
        state, reported by `error`. An end-of-sequence token after the grammar ended changes nothing."""
        token_id = int(token_id)
        if self._error is None:
            if not self._matcher.is_terminated():
                if self._matcher.accept_token(token_id):
                    return
            elif token_id in self._stop_ids:
                self._unseen += 1
                return
            self._error, self._error_at = f"token {token_id} is not allowed by the grammar here", self._unseen
        self._unseen += 1

    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` consumed tokens (the state is then as before them)."""
        unseen = min(num_tokens, self._unseen)
        self._unseen -= unseen
        if self._error is not None and self._unseen <= self._error_at:
            self._error = None
        if num_tokens > unseen:
            self._matcher.rollback(num_tokens - unseen)

    @property
    def stopped(self) -> bool:
        """Whether the grammar has ended (it then allows nothing more but the end of the output)."""
        return self._matcher.is_terminated()

    @property
    def error(self) -> str | None:
        return self._error


class XGrammarBackend:
    """xgrammar over one tokenizer (`tokenizer_json`: the tokenizer.json text) for a model of `vocab_size`
    logits; `eos_token_ids`: what ends a finished grammar. `compile` / `matcher` as `GrammarBackend`'s.
    Thread-safe (xgrammar's compiler is, and caches compiled grammars by their text)."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_token_ids: Iterable[int]) -> None:
        import tokenizers
        import xgrammar
        from transformers import PreTrainedTokenizerFast

        self._xgr = xgrammar
        eos = sorted({int(i) for i in eos_token_ids})
        self._lark = GrammarBackend(tokenizer_json, vocab_size, eos)  # kind "lark"
        tokenizer = tokenizers.Tokenizer.from_str(tokenizer_json)
        # the vocabulary type (byte-level, byte-fallback, raw) and prefix-space rule, read by xgrammar
        hf_tokenizer = PreTrainedTokenizerFast(tokenizer_object=tokenizer)
        detected = xgrammar.TokenizerInfo.from_huggingface(hf_tokenizer, vocab_size=vocab_size,
                                                           stop_token_ids=eos or None)
        vocab = [""] * vocab_size
        for text, token_id in tokenizer.get_vocab(with_added_tokens=True).items():
            if token_id < vocab_size:
                vocab[token_id] = text
        for token_id, added in tokenizer.get_added_tokens_decoder().items():
            if added.special and token_id < vocab_size:
                vocab[token_id] = ""  # xgrammar's mark of a special token: never part of the text
        info = xgrammar.TokenizerInfo.from_vocab_and_metadata(vocab, detected.dump_metadata())
        self._compiler = xgrammar.GrammarCompiler(info, cache_limit_bytes=_CACHE_BYTES)
        self.num_words = -(-vocab_size // 32)
        self._stop_ids = frozenset(i for i in eos if i < vocab_size)
        bits = np.zeros(self.num_words * 32, bool)
        bits[list(self._stop_ids)] = True
        self._stop_words = np.packbits(bits, bitorder="little").view(np.uint32)

    def _compile(self, kind: str, source: str):
        compiler = self._compiler
        try:
            if kind == "json_schema":
                json.loads(source)  # a JSON syntax error is named as such
                return compiler.compile_json_schema(source, any_whitespace=False, separators=_SEPARATORS)
            if kind == "regex":
                return compiler.compile_regex(source)
            if kind == "ebnf":
                return compiler.compile_grammar(source)
        except (ValueError, TypeError, RuntimeError) as exc:  # malformed JSON, a grammar xgrammar rejects
            lines = str(exc).strip().splitlines() or [type(exc).__name__]
            message = _SOURCE_PREFIX.sub("", lines[-1])  # "[12:00:00] /project/cpp/x.cc:75: " says nothing
            raise InvalidSamplingParamsError(f"{kind} is not a valid grammar: {message}") from None
        raise InvalidSamplingParamsError(f"unknown grammar kind {kind!r}; use one of "
                                         f"{', '.join(GRAMMAR_KINDS)}")

    def compile(self, kind: str, source: str) -> None:
        """Compile (and cache) the grammar; raises InvalidSamplingParamsError naming what is wrong."""
        if kind == "lark":
            self._lark.compile(kind, source)
        else:
            self._compile(kind, source)

    def matcher(self, kind: str, source: str) -> XGrammarMatcher | GrammarMatcher:
        """A fresh matcher for the grammar (compiled now if not cached)."""
        if kind == "lark":
            return self._lark.matcher(kind, source)
        compiled = self._compile(kind, source)
        return XGrammarMatcher(self._xgr.GrammarMatcher(compiled), self.num_words, self._stop_ids,
                               self._stop_words)
