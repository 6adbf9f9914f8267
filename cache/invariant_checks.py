"""Checks both trees' `check_invariants` share: one node's structure, and a live request's view of its locked
path; brute force, raising InvariantError.

Lock counts, accounting and ownership differ between the trees and stay in `cache.radix_invariants` and
`cache.swa_invariants`.
"""

from __future__ import annotations

from typing import Any, NoReturn

import numpy as np

from cache.errors import CacheError, InvariantError
from cache.keys import SLOT_DTYPE
from cache.slots import check_slots


def fail(msg: str) -> NoReturn:
    raise InvariantError(msg)


def check_node_shape(tree: Any, node: Any) -> None:
    """`node` is its parent's child under its child key; its key is in the tree's mode with one unit per
    slot and at least one; its cached key bytes are current; its key and value are whole pages and its slots
    valid tree values (`cache.slots.check_slots`)."""
    parent, page_size = node.parent, tree.page_size
    if parent is None or parent.children.get(node.child_key(page_size)) is not node:
        fail(f"{node!r} is not its parent's child under its child key")
    if node.key.bigram != tree.eagle or len(node.key) != node.num_units or node.num_units == 0:
        fail(f"{node!r}: key mode/length does not fit {node.num_units} slots (eagle={tree.eagle})")
    if node.key_bytes != node.key.tokens.tobytes():
        fail(f"{node!r}: cached key bytes are stale")
    if node.num_units % page_size:
        fail(f"{node!r}: {node.num_units} units is not whole pages of {page_size}")
    try:
        check_slots(node.value, page_size)
    except CacheError as exc:
        fail(f"{node!r}: {exc}")


def check_continues_parent(tree: Any, node: Any) -> None:
    """Below a non-root parent, `node` is in its parent's namespace and (EAGLE) its bigram key starts with
    the parent's last token."""
    parent = node.parent
    if parent is tree.root:
        return
    if parent.key.extra_key != node.key.extra_key:
        fail(f"{node!r}: namespace differs from its parent's")
    if tree.eagle and parent.key.tokens[-1] != node.key.tokens[0]:
        fail(f"{node!r}: bigram key does not continue its parent's last token")


def check_req_path(req: Any, path: list[Any]) -> None:
    """A live request's `kv_slots[:last_matched_prefix_len]` are exactly the slots on `path` (the root path of
    its `last_node`)."""
    num_tree = req.last_matched_prefix_len
    path_slots = np.concatenate([n.value for n in path]) if path else np.zeros(0, SLOT_DTYPE)
    if path_slots.shape[0] != num_tree or not np.array_equal(path_slots, req.kv_slots[:num_tree]):
        fail(f"request {req!r}: kv_slots[:{num_tree}] are not the tree's slots on its locked path")
