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

from cache.errors import CacheError
from cache.invariant_checks import (
    check_continues_parent,
    check_node_shape,
    check_partition,
    check_req_path,
    fail,
    free_pages,
    request_pages,
    whole_pages,
)
from cache.keys import SLOT_DTYPE


def _check_node(cache: Any, node: Any) -> None:
    check_node_shape(cache, node)
    parent = node.parent
    if node.lock_ref < 0 or (parent is not cache.root and parent.lock_ref < node.lock_ref):
        fail(f"{node!r}: lock_ref {node.lock_ref} vs parent's {parent.lock_ref}")
    check_continues_parent(cache, node)


def check_radix_invariants(cache: Any, live_reqs: Iterable[Any] = ()) -> dict[str, int]:
    """Raise InvariantError on any broken rule; else return the ownership counts.

    Returns `{'free', 'tree', 'live_only'}` in slots when `page_size == 1`, else
    `{'free_pages', 'tree_pages', 'live_only_pages'}` (the units of SGLang's demo, `cache/README.md` "Appendix
    A").
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
        fail(
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
            fail(f"request {req!r}: its last_node is not in the tree ({exc})")
        check_req_path(req, path)
        locks.update(path)
        private.append(request_pages(np.asarray(req.kv_slots[num_tree:], SLOT_DTYPE), page_size))
    for node, count in locks.items():
        if node.lock_ref < count:
            fail(f"{node!r}: lock_ref {node.lock_ref} < {count} live requests locking it")
    free = np.asarray(cache.allocator.free_slot_ids(), SLOT_DTYPE)
    tree = np.concatenate(tree_values) if tree_values else np.zeros(0, SLOT_DTYPE)
    free_units, tree_units = free_pages("full", free, page_size), whole_pages(tree, page_size)
    live_units = np.concatenate(private) if private else np.zeros(0, SLOT_DTYPE)
    unit = "page" if page_size > 1 else "slot"
    check_partition("full", {"free": free_units, "tree": tree_units, "live request": live_units},
                    getattr(cache.allocator, "num_pages", None), unit)
    names = (
        ("free", "tree", "live_only") if page_size == 1 else ("free_pages", "tree_pages", "live_only_pages")
    )
    return dict(zip(names, (free_units.shape[0], tree_units.shape[0], live_units.shape[0]), strict=True))
