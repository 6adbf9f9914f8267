"""Radix-tree keys: token ids held once as a numpy array, viewed as tokens or as EAGLE bigrams.

A key has *units*. In token mode a unit is one token: `len(key) == len(tokens)`. In bigram mode (EAGLE) unit
`i` is the pair `(tokens[i], tokens[i+1])`, so `len(key) == max(len(tokens) - 1, 0)`, and no tuple is ever
built: a bigram key of `n` units is stored as its `n + 1` tokens, and two bigram keys share `m` leading units
exactly when their token arrays share `m + 1` leading tokens. Slicing units `[a, b)` of a bigram key keeps
tokens `[a, b + 1)`, so consecutive slices overlap by one boundary token.

Deliberate difference from SGLang: keys are immutable values. `match_prefix` / `insert` never rewrite the
caller's key in place (SGLang converts `key.token_ids` to bigram tuples in place, so a caller reusing the key
saw it change); a key carries its mode, and converting is `key.as_bigram()`, idempotent and O(1).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from cache.errors import ExtraKeyMismatchError, InvalidTokensError, PageAlignmentError

TOKEN_DTYPE = np.int64
SLOT_DTYPE = np.int64
MAX_TOKEN_ID = 2**31 - 1  # token ids must fit the int32 arrays the device step uses


def as_token_array(token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """Validate token ids and return them as a read-only 1-D int64 array (no copy if already one).

    Raises InvalidTokensError for non-integer, negative, too-large or non-1-D input.
    """
    if isinstance(token_ids, np.ndarray):
        arr = token_ids
    else:
        try:
            arr = np.asarray(token_ids)
        except (TypeError, ValueError) as exc:
            raise InvalidTokensError(f"token ids must be a 1-D sequence of integers: {exc}") from None
    if arr.ndim != 1:
        raise InvalidTokensError(f"token ids must be 1-D, got an array of shape {arr.shape}")
    if arr.size == 0:
        arr = np.zeros(0, TOKEN_DTYPE)
    elif arr.dtype.kind not in "iu" or arr.dtype == np.bool_:
        example = arr[:3].tolist()
        raise InvalidTokensError(f"token ids must be integers, got dtype {arr.dtype} (e.g. {example})")
    elif arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0:
            raise InvalidTokensError(f"token ids must be >= 0, got {lo} at position {int(np.argmin(arr))}")
        if hi > MAX_TOKEN_ID:
            raise InvalidTokensError(f"token id {hi} does not fit int32 (max {MAX_TOKEN_ID})")
    if arr.dtype != TOKEN_DTYPE:
        arr = arr.astype(TOKEN_DTYPE)
    elif arr is token_ids and arr.flags.writeable:
        arr = arr.copy()  # never alias an array the caller may mutate later
    arr.flags.writeable = False
    return arr


_max = np.maximum.reduce  # the ufunc itself: ndarray.max adds a Python-level wrapper call


def token_array_and_bytes(token_ids: Sequence[int] | np.ndarray) -> tuple[np.ndarray, bytes]:
    """Validated token ids as a read-only int64 array that views an immutable copy, and that copy's bytes.

    One key preparation for a whole call: a 1-D int64 array costs one validating reduction and one copy;
    other input goes through `as_token_array`. Nodes may keep views of the array, and the caller may reuse
    its input. Raises InvalidTokensError like `as_token_array`.
    """
    if type(token_ids) is np.ndarray and token_ids.dtype == TOKEN_DTYPE and token_ids.ndim == 1:
        if token_ids.size and _max(token_ids.view(np.uint64)) > MAX_TOKEN_ID:  # negatives wrap: huge
            as_token_array(token_ids)  # raises the precise InvalidTokensError
        token_bytes = token_ids.tobytes()
    else:
        token_bytes = as_token_array(token_ids).tobytes()
    return np.frombuffer(token_bytes, TOKEN_DTYPE), token_bytes


@dataclass(frozen=True, slots=True)
class RadixKey:
    """An immutable key: `tokens` (read-only int64 array), unit mode, and an optional namespace.

    `extra_key` (LoRA id, cache salt, ...) namespaces the tree: keys with different extra keys never share a
    node below the root, and comparing them raises ExtraKeyMismatchError.
    """

    tokens: np.ndarray
    bigram: bool = False
    extra_key: Hashable | None = None

    @staticmethod
    def of(
        token_ids: Sequence[int] | np.ndarray, *, bigram: bool = False, extra_key: Hashable | None = None
    ) -> RadixKey:
        """Build a validated key from token ids (see `as_token_array` for what is rejected)."""
        return RadixKey(as_token_array(token_ids), bigram, extra_key)

    def __len__(self) -> int:
        n = self.tokens.shape[0]
        return max(n - 1, 0) if self.bigram else n

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.shape[0])

    def as_bigram(self) -> RadixKey:
        """The bigram view of the same tokens (idempotent, O(1))."""
        return self if self.bigram else RadixKey(self.tokens, True, self.extra_key)

    def units(self, start: int, stop: int | None = None) -> RadixKey:
        """Units `[start, stop)` as a key of the same mode and namespace (O(1): a view)."""
        n = len(self)
        stop = n if stop is None else min(max(stop, 0), n)
        start = min(max(start, 0), stop)
        if self.bigram:
            if stop == start:
                return RadixKey(self.tokens[start:start], True, self.extra_key)
            return RadixKey(self.tokens[start : stop + 1], True, self.extra_key)
        return RadixKey(self.tokens[start:stop], False, self.extra_key)

    def page_floor(self, page_size: int) -> RadixKey:
        """The longest prefix whose unit count is a multiple of `page_size`."""
        n = len(self)
        return self if n % page_size == 0 else self.units(0, n - n % page_size)

    def child_key(self, page_size: int) -> Hashable:
        """Dict key of the first page of units, as used in a node's `children` map.

        Token mode, P=1: the first token id (an int). Otherwise the bytes of the tokens that make up the first
        `page_size` units (P tokens, or P+1 tokens for bigrams). The extra key, if any, is paired with it.
        """
        if not self.bigram and page_size == 1:
            head: Hashable = int(self.tokens[0])
        else:
            head = self.tokens[: page_size + self.bigram].tobytes()
        return head if self.extra_key is None else (self.extra_key, head)

    def __repr__(self) -> str:
        toks = self.tokens[:10].tolist()
        more = ", ..." if self.tokens.shape[0] > 10 else ""
        mode = ", bigram" if self.bigram else ""
        extra = f", extra_key={self.extra_key!r}" if self.extra_key is not None else ""
        return f"RadixKey({toks}{more}{mode}{extra}; {len(self)} units)"


def match_units(a: RadixKey, b: RadixKey, page_size: int = 1) -> int:
    """Number of leading units `a` and `b` share, floored to a multiple of `page_size`.

    Both keys must be in the same mode and namespace. Cost: one vectorised compare of
    `min(len(a), len(b))` tokens (C speed), no Python loop over tokens.
    """
    if a.extra_key != b.extra_key:
        raise ExtraKeyMismatchError(f"cannot compare keys of extra_key {a.extra_key!r} and {b.extra_key!r}")
    if a.bigram != b.bigram:
        raise ValueError("cannot compare a bigram key with a token key")
    n = min(a.tokens.shape[0], b.tokens.shape[0])
    if n == 0:
        return 0
    diff = np.flatnonzero(a.tokens[:n] != b.tokens[:n])
    same_tokens = n if diff.size == 0 else int(diff[0])
    units = max(same_tokens - 1, 0) if a.bigram else same_tokens
    units = min(units, len(a), len(b))
    return units - units % page_size


def check_page_aligned(num_units: int, page_size: int, what: str) -> None:
    """Raise PageAlignmentError unless `num_units` is a multiple of `page_size`."""
    if num_units % page_size:
        raise PageAlignmentError(f"{what} has {num_units} units, not a multiple of page_size={page_size}")


def tree_key(
    token_ids: Sequence[int] | np.ndarray | RadixKey, extra_key: Hashable | None = None, *, eagle: bool
) -> RadixKey:
    """A tree's view of `token_ids` (both trees' `make_key`): validated, bigram when `eagle` (idempotent), in
    `extra_key`'s namespace. A given RadixKey keeps its own namespace; passing a different `extra_key` raises
    ExtraKeyMismatchError, and a bigram key for a tree with `eagle=False` raises ValueError."""
    if isinstance(token_ids, RadixKey):
        if extra_key is not None and token_ids.extra_key != extra_key:
            raise ExtraKeyMismatchError(
                f"key has extra_key {token_ids.extra_key!r}, call passed {extra_key!r}"
            )
        if token_ids.bigram and not eagle:
            raise ValueError("a bigram key was passed to a tree built with eagle=False")
        return token_ids.as_bigram() if eagle else token_ids
    return RadixKey.of(token_ids, bigram=eagle, extra_key=extra_key)


def tree_key_and_bytes(
    token_ids: Sequence[int] | np.ndarray | RadixKey, extra_key: Hashable | None = None, *, eagle: bool
) -> tuple[RadixKey, bytes]:
    """`tree_key` plus the key's token bytes, validating a raw token list only once (both trees' match and
    insert prepare their key here, once per call)."""
    if isinstance(token_ids, RadixKey):
        key = tree_key(token_ids, extra_key, eagle=eagle)
        return key, key.tokens.tobytes()
    tokens, token_bytes = token_array_and_bytes(token_ids)
    return RadixKey(tokens, eagle, extra_key), token_bytes
