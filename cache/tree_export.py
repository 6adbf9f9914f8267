"""Both trees' `export_state()` / `import_state()` (`cache.tree_state.TreeState`): a tree as plain data
and back, so that the imported tree behaves exactly as the exported one: same matches, same splits, same
eviction and tombstoning order, same slots freed in the same order.

Export walks the tree parent-first in each node's children order, so import, inserting children in index
order, rebuilds the same children order (which `reset` and `evict_subtree` free in). The plain tree's LRU
order is its stamps ordered with ties broken by node id, which is what its eviction heap compares; import
gives the nodes stamps `1..n` in that order and continues the tick counter from `n`, so every later stamp
is newer than all imported ones, as in the original. The SWA tree's two intrusive lists are rebuilt in
their saved order. Export refuses a tree with a locked node (a live request's lock is not part of a cached
tree); lock ids (`swa_uuid`) are dropped, which changes nothing once no lock is held: a uuid only names
the node a later unlock stops at.

Import takes ownership of `state.slots`: the caller has them allocated for this tree and owned by nobody
else; for the SWA tree a live node's full slots must map to SWA slots and a tombstone's to none
(`cache.state_slots.allocate_state_slots` arranges that in a fresh allocator). Everything is checked before
the tree changes; a bad state raises StateError. O(nodes + slots), plus one O(pool) look at the
allocator's free set. This module has the plain tree's part and what both share; the SWA tree's is in
`cache.swa_export` (so the plain tree never imports the hybrid tree's modules).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cache.errors import StateError
from cache.keys import SLOT_DTYPE, TOKEN_DTYPE, RadixKey
from cache.node import TreeNode
from cache.tree_state import TreeState

_NO_SLOTS = np.zeros(0, SLOT_DTYPE)


def walk(root: Any) -> list[Any]:
    """Non-root nodes parent-first, each subtree in children order (a pre-order walk)."""
    out, stack = [], list(reversed(root.children.values()))
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(reversed(node.children.values()))
    return out


def refuse_locked(num_locked: int) -> None:
    """Export's precondition: raise StateError when `num_locked` nodes are locked."""
    if num_locked:
        raise StateError(f"cannot export a tree with {num_locked} locked node(s); release the live requests")


def base_state(tree: Any, nodes: list[Any], full_lru: list[Any], **swa: Any) -> TreeState:
    """The state of `nodes` (from `walk`) with `full_lru` (the same nodes, least recent first) and the SWA
    fields `swa`; every array is a fresh copy, none aliases the tree."""
    index = {id(node): i for i, node in enumerate(nodes)}
    tokens = [node.key.tokens for node in nodes]
    return TreeState(
        page_size=tree.page_size,
        eagle=tree.eagle,
        parents=np.array([index.get(id(node.parent), -1) for node in nodes], np.int64),
        token_offsets=np.concatenate([[0], np.cumsum([t.shape[0] for t in tokens], dtype=np.int64)]),
        tokens=np.concatenate(tokens).astype(TOKEN_DTYPE) if tokens else np.zeros(0, TOKEN_DTYPE),
        extra_keys=tuple(node.key.extra_key for node in nodes),
        slots=np.concatenate([n.value for n in nodes]).astype(SLOT_DTYPE) if nodes else _NO_SLOTS,
        full_lru=np.array([index[id(node)] for node in full_lru], np.int64),
        **swa,
    )


def export_radix(tree: Any) -> TreeState:
    """`RadixCache.export_state`."""
    nodes = walk(tree.root)
    refuse_locked(sum(1 for node in nodes if node.lock_ref > 0))
    return base_state(tree, nodes, sorted(nodes))  # TreeNode orders by (last_access, id)


def check_importable(tree: Any, state: TreeState, sliding_window: int | None) -> None:
    """Raise StateError unless `state` is valid and fits `tree` (kind, page size, key mode, window; empty;
    its slots not free in the tree's allocator)."""
    if (state.page_size, state.eagle, state.sliding_window) != (tree.page_size, tree.eagle, sliding_window):
        raise StateError(
            f"state of page_size={state.page_size}, eagle={state.eagle}, sliding_window="
            f"{state.sliding_window}; the tree has {tree.page_size}, {tree.eagle}, {sliding_window}"
        )
    if tree.num_nodes:
        raise StateError(f"import needs an empty tree, this one has {tree.num_nodes} nodes")
    if tree.disabled and state.num_nodes:
        raise StateError("a disabled tree caches nothing: it cannot import nodes")
    state.check()
    if np.isin(state.slots, np.asarray(tree.allocator.free_slot_ids(), SLOT_DTYPE)).any():
        raise StateError("some of the state's slots are free in the tree's allocator")


def node_keys(state: TreeState) -> list[tuple[RadixKey, bytes]]:
    """Each node's key and its token bytes, as views of one read-only copy of the tokens."""
    tokens = np.array(state.tokens, TOKEN_DTYPE)
    tokens.flags.writeable = False
    offsets = state.token_offsets.tolist()
    out = []
    for i, extra_key in enumerate(state.extra_keys):
        toks = tokens[offsets[i] : offsets[i + 1]]
        out.append((RadixKey(toks, state.eagle, extra_key), toks.tobytes()))
    return out


def node_values(state: TreeState) -> list[np.ndarray]:
    """Each node's full slots, as views of one copy of `state.slots`."""
    slots = np.array(state.slots, SLOT_DTYPE)
    offsets = state.slot_offsets.tolist()
    return [slots[offsets[i] : offsets[i + 1]] for i in range(state.num_nodes)]


def import_radix(tree: Any, state: TreeState) -> None:
    """`RadixCache.import_state`."""
    check_importable(tree, state, None)
    stamp = np.empty(state.num_nodes, np.int64)
    stamp[state.full_lru] = np.arange(1, state.num_nodes + 1)
    nodes: list[TreeNode] = []
    for i, ((key, key_bytes), value) in enumerate(zip(node_keys(state), node_values(state), strict=True)):
        parent = nodes[state.parents[i]] if state.parents[i] >= 0 else tree.root
        node = TreeNode(key, value, parent, int(stamp[i]), key_bytes)
        parent.children[node.child_key(tree.page_size)] = node
        nodes.append(node)
    tree._tick = state.num_nodes
    tree._num_nodes = state.num_nodes
    tree._evictable_size = int(state.slots.shape[0])
    for node in nodes:
        tree._lru.push_if_evictable(node)
