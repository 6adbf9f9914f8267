"""What `match_prefix` returns, and the one-node key comparison both walks (match and insert) use."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from cache.node import TreeNode
from cache.node_base import _TOKEN_BYTES


class MatchResult(NamedTuple):
    """`slots`: the cached full slots of the matched prefix, one per key unit (a fresh int64 array the caller
    may keep). `node`: the deepest node of the match (the root when nothing matched); lock it to keep
    `slots` from being evicted. The tree still owns `slots`."""

    slots: np.ndarray
    node: Any


def common_units(
    node: TreeNode,
    tokens: np.ndarray,
    token_bytes: bytes,
    pos: int,
    num_units: int,
    bigram: int,
    page_size: int,
) -> int:
    """Leading units shared by `node`'s key and the query's units `[pos, num_units)`, floored to pages.

    `tokens` / `token_bytes` are the query's token ids (array and its bytes), `bigram` is 1 in EAGLE mode.
    Cost: one memcmp of the overlap; only on a mismatch one vectorised compare to find where. No Python loop
    over tokens.
    """
    node_units = node.value.shape[0]
    overlap = min(node_units, num_units - pos) + bigram  # tokens to compare
    start = pos * _TOKEN_BYTES
    stop = start + overlap * _TOKEN_BYTES
    if overlap == node_units + bigram:
        same = token_bytes[start:stop] == node.key_bytes
    else:
        same = token_bytes[start:stop] == node.key_bytes[: overlap * _TOKEN_BYTES]
    if same:
        units = overlap - bigram
    else:
        differs = node.key.tokens[:overlap] != tokens[pos : pos + overlap]
        units = max(int(differs.argmax()) - bigram, 0)
    return units - units % page_size
