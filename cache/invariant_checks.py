"""Checks both trees' `check_invariants` share: one node's structure, brute force, raising InvariantError.

Lock counts, accounting and ownership differ between the trees and stay in `cache.radix_invariants` and
`cache.swa_invariants`.
"""

from __future__ import annotations

from typing import Any, NoReturn

from cache.errors import CacheError, InvariantError
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
