"""`RadixCache.check_invariants`: the ownership rule and the accounting, proven by brute force.

G1 (ownership): every allocatable slot is in exactly one of: the allocator's free set, the value of one tree
node, or the private tail `kv_slots[last_matched_prefix_len:]` of one live request. With `page_size > 1`
this holds for pages: a request's private tail may end inside a page, and that whole page is the request's.
G2 (no double ownership) is the "exactly": the three sets never overlap.
A1: evictable + protected == total units in the tree, split by lock state. A2: a node's lock_ref is at least
each child's and at least the number of live requests whose lock covers it.
Structure: child keys, parent links, key/value lengths, whole pages, bigram continuity, one namespace per
path. Also: each live request's `kv_slots[:last_matched_prefix_len]` equals the tree's slots on the path of
its `last_node`, which is in the tree.
Cost: O(nodes + pool) with numpy; for tests and debugging only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

import numpy as np

from cache.errors import CacheError, InvariantError
from cache.keys import SLOT_DTYPE
from cache.slots import check_slots


def _fail(msg: str) -> None:
    raise InvariantError(msg)


def _check_node(cache: Any, node: Any) -> None:
    parent, page_size = node.parent, cache.page_size
    if parent.children.get(node.child_key(page_size)) is not node:
        _fail(f"{node!r} is not its parent's child under its child key")
    if node.key.bigram != cache.eagle or len(node.key) != node.num_units or node.num_units == 0:
        _fail(f"{node!r}: key mode/length does not fit {node.num_units} slots (eagle={cache.eagle})")
    if node.key_bytes != node.key.tokens.tobytes():
        _fail(f"{node!r}: cached key bytes are stale")
    if node.num_units % page_size:
        _fail(f"{node!r}: {node.num_units} units is not whole pages of {page_size}")
    try:
        check_slots(node.value, page_size)
    except CacheError as exc:
        _fail(f"{node!r}: {exc}")
    if node.lock_ref < 0 or (parent is not cache.root and parent.lock_ref < node.lock_ref):
        _fail(f"{node!r}: lock_ref {node.lock_ref} vs parent's {parent.lock_ref}")
    if parent is not cache.root:
        if parent.key.extra_key != node.key.extra_key:
            _fail(f"{node!r}: namespace differs from its parent's")
        if cache.eagle and parent.key.tokens[-1] != node.key.tokens[0]:
            _fail(f"{node!r}: bigram key does not continue its parent's last token")


def _pages(slots: np.ndarray, page_size: int) -> np.ndarray:
    return slots // page_size if page_size > 1 else slots


def check_radix_invariants(cache: Any, live_reqs: Iterable[Any] = ()) -> dict[str, int]:
    """Raise InvariantError on any broken rule; else return the ownership counts.

    Returns `{'free', 'tree', 'live_only'}` in slots when `page_size == 1`, else
    `{'free_pages', 'tree_pages', 'live_only_pages'}` (the units of SGLang's demo, reference Appendix A).
    """
    page_size = cache.page_size
    evictable = protected = 0
    tree_values = []
    for node in cache.iter_nodes():
        _check_node(cache, node)
        evictable += node.num_units if node.lock_ref == 0 else 0
        protected += node.num_units if node.lock_ref > 0 else 0
        tree_values.append(node.value)
    if (evictable, protected) != (cache.evictable_size, cache.protected_size):
        _fail(
            f"accounting: nodes hold evictable={evictable}, protected={protected}; the tree counts "
            f"evictable={cache.evictable_size}, protected={cache.protected_size}"
        )
    locks: Counter = Counter()
    private = []
    for req in live_reqs:
        num_tree = req.last_matched_prefix_len
        try:
            path = cache._path(req.last_node) if req.last_node is not cache.root else []
        except CacheError as exc:
            _fail(f"request {req!r}: its last_node is not in the tree ({exc})")
        path_slots = np.concatenate([n.value for n in path]) if path else np.zeros(0, SLOT_DTYPE)
        if path_slots.shape[0] != num_tree or not np.array_equal(path_slots, req.kv_slots[:num_tree]):
            _fail(f"request {req!r}: kv_slots[:{num_tree}] are not the tree's slots on its locked path")
        locks.update(path)
        private.append(np.unique(_pages(np.asarray(req.kv_slots[num_tree:], SLOT_DTYPE), page_size)))
    for node, count in locks.items():
        if node.lock_ref < count:
            _fail(f"{node!r}: lock_ref {node.lock_ref} < {count} live requests locking it")
    free = np.asarray(cache.allocator.free_slot_ids(), SLOT_DTYPE)
    tree = np.concatenate(tree_values) if tree_values else np.zeros(0, SLOT_DTYPE)
    free_units, tree_units = np.unique(_pages(free, page_size)), _pages(tree[::page_size], page_size)
    if free_units.shape[0] * page_size != free.shape[0]:
        _fail(f"the allocator's free set ({free.shape[0]} slots) is not whole, distinct pages of {page_size}")
    live_units = np.concatenate(private) if private else np.zeros(0, SLOT_DTYPE)
    owned = np.concatenate([free_units, tree_units, live_units])
    uniq, counts = np.unique(owned, return_counts=True)
    if (counts > 1).any():
        unit = "page" if page_size > 1 else "slot"
        _fail(f"{unit}s owned twice (free / tree / live request): {uniq[counts > 1][:10].tolist()}")
    num_pages = getattr(cache.allocator, "num_pages", None)
    if num_pages is not None and uniq.shape[0] != num_pages:
        missing = np.setdiff1d(np.arange(1, num_pages + 1), uniq)[:10].tolist()
        _fail(f"leak: {num_pages - uniq.shape[0]} page(s) owned by nobody, e.g. {missing}")
    names = (
        ("free", "tree", "live_only") if page_size == 1 else ("free_pages", "tree_pages", "live_only_pages")
    )
    return dict(zip(names, (free_units.shape[0], tree_units.shape[0], live_units.shape[0]), strict=True))
