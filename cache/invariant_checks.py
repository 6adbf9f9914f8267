"""Checks both trees' `check_invariants` share: one node's structure, a live request's view of its locked
path, and the ownership partition of a pool's pages; brute force, raising InvariantError.

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


def whole_pages(slots: np.ndarray, page_size: int) -> np.ndarray:
    """The page ids of `slots` that are whole pages in order (tree values, as `check_slots` proves): one id
    per page, so a page held twice stays twice (an `np.unique` here would hide double ownership)."""
    return slots[::page_size] // page_size if page_size > 1 else slots


def request_pages(slots: np.ndarray, page_size: int) -> np.ndarray:
    """The distinct page ids one request's private tail touches (it may end inside a page)."""
    return np.unique(slots // page_size) if page_size > 1 else slots


def free_pages(kind: str, free_slots: np.ndarray, page_size: int) -> np.ndarray:
    """The page ids of an allocator's free slots, which must be whole, distinct pages (a slot freed twice
    fails here when pages are bigger than one slot, and in `check_partition` when they are single slots)."""
    if page_size == 1:
        return free_slots
    pages = np.unique(free_slots // page_size)
    if pages.shape[0] * page_size != free_slots.shape[0]:
        fail(f"{kind}: the allocator's free set ({free_slots.shape[0]} slots) is not whole, distinct pages "
             f"of {page_size}")
    return pages


def check_partition(kind: str, groups: dict[str, np.ndarray], num_total: int | None, unit: str) -> None:
    """Ownership of one pool: every id (a page, or a slot when pages are single slots) in `groups` lies in
    exactly one group, once (G2); with `num_total` known, ids are in 1..num_total (0 is the reserved page)
    and every one of them is owned (G1: no leak). O(ids + pool) in a handful of numpy calls."""
    owned = np.concatenate(list(groups.values())) if groups else np.zeros(0, SLOT_DTYPE)
    lo, hi = (int(owned.min()), int(owned.max())) if owned.size else (0, 0)
    if lo < 0 or (num_total is not None and hi > num_total):
        fail(f"{kind} {unit} ids outside 1..{num_total}: min {lo}, max {hi}")
    counts = np.bincount(owned, minlength=max(hi, num_total or 0) + 1)
    twice = np.flatnonzero(counts > 1)
    if twice.size:
        fail(f"{kind} {unit}s owned twice ({' / '.join(groups)}): {twice[:10].tolist()}")
    if num_total is not None:
        if counts[0]:
            fail(f"{kind}: the reserved {unit} 0 is owned ({' / '.join(groups)})")
        missing = np.flatnonzero(counts[1:] == 0) + 1
        if missing.size:
            fail(f"{kind} leak: {missing.size} {unit}(s) owned by nobody, e.g. {missing[:10].tolist()}")
