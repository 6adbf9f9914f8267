"""RadixKey: validation, units (tokens / EAGLE bigrams), slicing, child keys, and `match_units` against a
brute-force tuple model (the rules of "Keys" in `cache/README.md`; SGLang's TestRadixKey cases that apply to
our API)."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache import ExtraKeyMismatchError, InvalidTokensError, PageAlignmentError, RadixKey, match_units
from cache.keys import as_token_array, check_page_aligned


def test_init_basic_and_with_extra_key() -> None:
    key = RadixKey.of([1, 2, 3])
    assert key.tokens.tolist() == [1, 2, 3] and key.extra_key is None and not key.bigram
    assert RadixKey.of([1, 2, 3], extra_key="lora").extra_key == "lora"
    assert key.tokens.dtype == np.int64 and not key.tokens.flags.writeable


@pytest.mark.parametrize(
    ("tokens", "num_tokens", "num_bigrams"), [([], 0, 0), ([5], 1, 0), ([1, 2, 3], 3, 2)]
)
def test_len_counts_units(tokens: list[int], num_tokens: int, num_bigrams: int) -> None:
    assert len(RadixKey.of(tokens)) == num_tokens
    assert len(RadixKey.of(tokens, bigram=True)) == num_bigrams  # a single token has no bigram
    assert RadixKey.of(tokens, bigram=True).num_tokens == len(tokens)  # tokens stored once


def test_units_slicing_keeps_mode_and_extra_key() -> None:
    key = RadixKey.of([10, 20, 30, 40, 50], extra_key="x")
    part = key.units(1, 4)
    assert part.tokens.tolist() == [20, 30, 40] and part.extra_key == "x"
    assert len(key.units(2, 2)) == 0 and key.units(0).tokens.tolist() == key.tokens.tolist()
    bigram = key.as_bigram()
    upper, lower = bigram.units(0, 2), bigram.units(2)
    assert upper.tokens.tolist() == [10, 20, 30] and len(upper) == 2  # (10,20), (20,30)
    assert lower.tokens.tolist() == [30, 40, 50] and len(lower) == 2  # overlaps by one boundary token
    assert len(bigram.units(3, 3)) == 0 and upper.bigram and upper.extra_key == "x"


def test_as_bigram_is_idempotent_and_does_not_change_the_original() -> None:
    key = RadixKey.of([1, 2, 3])
    bigram = key.as_bigram()
    assert bigram.as_bigram() is bigram and not key.bigram and bigram.tokens is key.tokens


def test_caller_array_is_not_aliased() -> None:
    ids = np.array([1, 2, 3], dtype=np.int64)
    key = RadixKey.of(ids)
    ids[0] = 99
    assert key.tokens.tolist() == [1, 2, 3]


@pytest.mark.parametrize(
    "bad", [[1, -1], [1.5, 2.0], [[1, 2], [3, 4]], [2**31], np.array([True, False]), ["a", "b"], "abc"]
)
def test_invalid_token_ids_raise(bad) -> None:
    with pytest.raises(InvalidTokensError):
        RadixKey.of(bad)


def test_accepts_other_integer_dtypes() -> None:
    assert as_token_array(np.array([1, 2], dtype=np.int32)).dtype == np.int64
    assert as_token_array(np.array([1, 2], dtype=np.uint16)).tolist() == [1, 2]


def test_repr_shows_tokens_mode_and_extra_key() -> None:
    text = repr(RadixKey.of([1, 2, 3], extra_key="test"))
    assert "RadixKey" in text and "[1, 2, 3]" in text and "extra_key='test'" in text
    long = repr(RadixKey.of(list(range(15))))
    assert "8, 9], ..." in long and "10" not in long and "15 units" in long  # truncated after 10 ids
    assert "bigram" in repr(RadixKey.of([1, 2], bigram=True))


def test_child_key_is_the_first_page_and_namespaced() -> None:
    key = RadixKey.of([7, 8, 9, 10])
    assert key.child_key(1) == 7
    assert key.child_key(2) == np.array([7, 8], np.int64).tobytes()
    assert key.as_bigram().child_key(1) == np.array([7, 8], np.int64).tobytes()  # the first bigram
    assert RadixKey.of([7, 8], extra_key="a").child_key(1) == ("a", 7)


def test_match_units_across_namespaces_or_modes_raises() -> None:
    with pytest.raises(ExtraKeyMismatchError):
        match_units(RadixKey.of([1], extra_key="a"), RadixKey.of([1], extra_key="b"))
    with pytest.raises(ValueError, match="bigram"):
        match_units(RadixKey.of([1, 2]), RadixKey.of([1, 2], bigram=True))


def test_check_page_aligned() -> None:
    check_page_aligned(8, 4, "key")
    with pytest.raises(PageAlignmentError, match="page_size=4"):
        check_page_aligned(6, 4, "key")


def brute_match(a: list[int], b: list[int], bigram: bool, page_size: int) -> int:
    units_a = list(pairwise(a)) if bigram else a
    units_b = list(pairwise(b)) if bigram else b
    n = 0
    while n < min(len(units_a), len(units_b)) and units_a[n] == units_b[n]:
        n += 1
    return n - n % page_size


@settings(max_examples=200, deadline=None)
@given(
    a=st.lists(st.integers(0, 3), max_size=12),
    b=st.lists(st.integers(0, 3), max_size=12),
    bigram=st.booleans(),
    page_size=st.sampled_from([1, 2, 4]),
)
def test_match_units_equals_tuple_model(a: list[int], b: list[int], bigram: bool, page_size: int) -> None:
    """A bigram match of n units is a token match of n + 1 tokens, computed without building tuples."""
    got = match_units(RadixKey.of(a, bigram=bigram), RadixKey.of(b, bigram=bigram), page_size)
    assert got == brute_match(a, b, bigram, page_size)
