"""The SWA tree's `export_state()` / `import_state()`; the rules both trees share are in `cache.tree_export`.

Beyond the plain tree's fields the state carries each node's tombstone flag and the two intrusive LRU lists
(full: every node, SWA: live nodes), each least recent first; import pushes them back in that order.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cache.errors import StateError
from cache.swa_node import SWANode
from cache.tree_export import base_state, check_importable, node_keys, node_values, refuse_locked, walk
from cache.tree_state import TreeState


def export_swa(tree: Any) -> TreeState:
    """`SWARadixCache.export_state`."""
    nodes = walk(tree.root)
    refuse_locked(sum(1 for node in nodes if node.full_lock_ref > 0))  # S1: SWA locks imply full ones
    index = {id(node): i for i, node in enumerate(nodes)}
    swa_lru = [index[id(node)] for node in reversed(list(tree.swa_lru.owners_mru_first()))]
    return base_state(
        tree,
        nodes,
        list(reversed(list(tree.full_lru.owners_mru_first()))),
        sliding_window=tree.sliding_window,
        tombstone=np.array([node.tombstone for node in nodes], bool),
        swa_lru=np.array(swa_lru, np.int64),
    )


def import_swa(tree: Any, state: TreeState) -> None:
    """`SWARadixCache.import_state`."""
    check_importable(tree, state, tree.sliding_window)
    mapped = tree.allocator.swa_slots_of(state.slots) != 0
    live_slots = np.repeat(state.live, state.num_units)
    if not np.array_equal(mapped, live_slots):
        raise StateError("a live node's slots map to no SWA slot, or a tombstone's still map to one")
    nodes: list[SWANode] = []
    for i, ((key, _), value) in enumerate(zip(node_keys(state), node_values(state), strict=True)):
        parent = nodes[state.parents[i]] if state.parents[i] >= 0 else tree.root
        node = SWANode(key, value, parent, bool(state.tombstone[i]))
        parent.children[node.child_key(tree.page_size)] = node
        nodes.append(node)
    for i in state.full_lru.tolist():  # least recent first: each push goes in front of the previous
        tree.full_lru.push_mru(nodes[i].full_link)
    for i in state.swa_lru.tolist():
        tree.swa_lru.push_mru(nodes[i].swa_link)
    tree._full_evictable = int(state.slots.shape[0])
    tree._swa_evictable = int(live_slots.sum())
