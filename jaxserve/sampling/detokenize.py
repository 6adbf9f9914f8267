"""Incremental detokenization: the text of a growing token list, decoding a small window per token.

The window starts one committed chunk back so tokenizers that drop a leading space at the start of a decode
(SentencePiece) still produce it; a window ending in U+FFFD is an incomplete multi-byte character, held until
the next token completes it (or `flush` at the end).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Detokenize = Callable[[Sequence[int]], str]

_INCOMPLETE = "\ufffd"


class IncrementalDetokenizer:
    """Invariant: `text` == detokenize(ids[:read_offset]) as far as the tokenizer decodes prefix-stably."""

    def __init__(self, detokenize: Detokenize) -> None:
        self._detokenize = detokenize
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self.text = ""

    def append(self, token_id: int) -> str:
        """Add one token; return the text it committed ('' while a character is incomplete)."""
        self._ids.append(token_id)
        window = self._detokenize(self._ids[self._prefix_offset :])
        if window.endswith(_INCOMPLETE):
            return ""
        return self._commit(window)

    def extend(self, token_ids: Sequence[int]) -> str:
        """Add several tokens with one window decode; return the text they committed. Gives the text that
        `append` of each in turn gives: when the whole window ends in an incomplete character, the tokens
        go through `append` one by one instead (so the complete characters before it are committed)."""
        if len(token_ids) <= 1:
            return self.append(token_ids[0]) if token_ids else ""
        self._ids.extend(token_ids)
        window = self._detokenize(self._ids[self._prefix_offset :])
        if not window.endswith(_INCOMPLETE):
            return self._commit(window)
        del self._ids[-len(token_ids):]
        return "".join(self.append(t) for t in token_ids)

    def flush(self) -> str:
        """Commit every pending token even if it ends in an incomplete character; return the new text."""
        if self._read_offset == len(self._ids):
            return ""
        return self._commit(self._detokenize(self._ids[self._prefix_offset :]))

    def _commit(self, window: str) -> str:
        context = self._detokenize(self._ids[self._prefix_offset : self._read_offset])
        if window.startswith(context):
            delta = window[len(context) :]
        else:  # the tokenizer is not prefix-stable on this window: fall back to a full decode
            delta = self._detokenize(self._ids)[len(self.text) :]
        self.text += delta
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return delta
