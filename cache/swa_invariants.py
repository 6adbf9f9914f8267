"""`SWARadixCache.check_invariants`: ownership on both pools, S1-S7 and the accounting, by brute force.

Full side (G1/G2): every allocatable full page is in exactly one of: the allocator's free set, the value of
one tree node (tombstones included), or the private tail `kv_slots[last_matched_prefix_len:]` of one live
request.
SWA side: every SWA page is either free, or mapped from exactly one full page of a live (non-tombstone) node
or of a live request's private tail; a tombstone's pages map to 0 (S7). With `page_size == 1` pages are slots.
Tree (`cache/README.md`, "SWA tree: data model"): S1 `full_lock_ref >= swa_lock_ref >= 0`, S2/S3 LRU list
membership, S4 no leaf is a tombstone, S5 a tombstone holds no SWA lock, S6 evictable + protected sizes, S7
the mapping; plus structure (child keys, parents, key/value lengths, whole pages, bigram continuity, one
namespace per path) and, for each live request, `kv_slots[:last_matched_prefix_len]` equal to the slots on its
locked path, full locks on that path and SWA locks on its last window. Cost: O(nodes + pool) with numpy; for
tests and debugging only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

import numpy as np

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

_NONE = np.zeros(0, SLOT_DTYPE)


def _check_node(tree: Any, node: Any) -> None:
    check_node_shape(tree, node)
    parent = node.parent
    if not node.full_lock_ref >= node.swa_lock_ref >= 0:
        fail(f"S1: {node!r} has full_lock_ref < swa_lock_ref or a negative count")
    if node.tombstone and (node.swa_lock_ref or not node.children):
        fail(f"S4/S5: tombstone {node!r} is a leaf or holds an SWA lock")
    if parent is not tree.root and parent.full_lock_ref < node.full_lock_ref:
        fail(f"{node!r}: full_lock_ref {node.full_lock_ref} above its parent's {parent.full_lock_ref}")
    check_continues_parent(tree, node)


def _check_tree(tree: Any) -> list[Any]:
    nodes = list(tree.iter_nodes())
    sizes = Counter()
    for node in nodes:
        _check_node(tree, node)
        sizes["full_protected" if node.full_lock_ref else "full_evictable"] += node.num_units
        if not node.tombstone:
            sizes["swa_protected" if node.swa_lock_ref else "swa_evictable"] += node.num_units
    for name in ("full_evictable", "full_protected", "swa_evictable", "swa_protected"):
        if sizes[name] != getattr(tree, f"{name}_size"):
            fail(f"S6: nodes hold {name}={sizes[name]}, the tree counts {getattr(tree, f'{name}_size')}")
    in_full = list(tree.full_lru.owners_mru_first())
    in_swa = list(tree.swa_lru.owners_mru_first())
    if len(in_full) != len(nodes) or {id(n) for n in in_full} != {id(n) for n in nodes}:
        fail(f"S2: the full LRU list has {len(in_full)} members, the tree {len(nodes)} nodes")
    live = [n for n in nodes if not n.tombstone]
    if len(in_swa) != len(live) or {id(n) for n in in_swa} != {id(n) for n in live}:
        fail(f"S3: the SWA LRU list has {len(in_swa)} members, the tree {len(live)} live nodes")
    return nodes


def _check_requests(tree: Any, live_reqs: Iterable[Any]) -> list[np.ndarray]:
    """Check each live request's view of the tree and locks; return their private tails."""
    full_locks: Counter = Counter()
    swa_locks: Counter = Counter()
    private = []
    for req in live_reqs:
        num_tree = req.last_matched_prefix_len
        path = tree._path(req.last_node) if req.last_node is not tree.root else []
        check_req_path(req, path)
        full_locks.update(path)
        swa_locks.update(path[len(path) - tree._swa_lock_span(path) :])
        private.append(np.asarray(req.kv_slots[num_tree:], SLOT_DTYPE))
    for node, n in full_locks.items():
        if node.full_lock_ref < n:
            fail(f"{node!r}: full_lock_ref {node.full_lock_ref} < {n} live requests locking it")
    for node, n in swa_locks.items():
        if node.swa_lock_ref < n or node.tombstone:
            fail(f"{node!r}: in the window of {n} live requests but swa_lock_ref={node.swa_lock_ref}")
    return private


def check_swa_invariants(tree: Any, live_reqs: Iterable[Any] = ()) -> dict[str, int]:
    """Raise InvariantError on any broken rule; else return slot counts `{'free', 'tree', 'live_only',
    'swa_free'}` (the units of SGLang's demo, `cache/README.md` "Appendix A"). Pool sizes are checked for
    leaks when the allocator exposes `num_pages` / `num_swa_pages`."""
    page_size, alloc = tree.page_size, tree.allocator
    nodes = _check_tree(tree)
    private = _check_requests(tree, live_reqs)

    live_vals = [n.value for n in nodes if not n.tombstone]
    tomb_vals = [n.value for n in nodes if n.tombstone]
    live_tree = np.concatenate(live_vals) if live_vals else _NONE
    tomb_tree = np.concatenate(tomb_vals) if tomb_vals else _NONE
    if (alloc.swa_slots_of(tomb_tree) != 0).any():
        fail("S7: a tombstone's full slots still map to SWA slots")
    unit = "page" if page_size > 1 else "slot"
    live_pages = whole_pages(live_tree, page_size)
    tree_pages = np.concatenate([live_pages, whole_pages(tomb_tree, page_size)])
    private_pages = [request_pages(p, page_size) for p in private]
    req_pages = np.concatenate(private_pages) if private_pages else _NONE
    free = np.asarray(alloc.free_slot_ids(), SLOT_DTYPE)
    full_groups = {"free": free_pages("full", free, page_size), "tree": tree_pages, "live request": req_pages}
    check_partition("full", full_groups, getattr(alloc, "num_pages", None), unit)
    mapped_from = np.concatenate([live_pages, req_pages])
    swa = alloc.swa_slots_of(mapped_from * page_size)
    if (swa == 0).any():
        bad = mapped_from[swa == 0][:10].tolist()
        fail(f"S7: full pages {bad} of live nodes or live requests map to no SWA slot")
    swa_free = np.asarray(alloc.free_swa_slot_ids(), SLOT_DTYPE)
    swa_groups = {"free": free_pages("SWA", swa_free, page_size), "mapped": swa // page_size}
    check_partition("SWA", swa_groups, getattr(alloc, "num_swa_pages", None), unit)
    num_private = sum(int(p.shape[0]) for p in private)
    return {
        "free": int(free.shape[0]),
        "tree": int(live_tree.shape[0] + tomb_tree.shape[0]),
        "live_only": num_private,
        "swa_free": int(swa_free.shape[0]),
    }
