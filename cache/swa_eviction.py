"""Eviction in the SWA tree: `evict(full_num_tokens, swa_num_tokens)`'s two phases (`cache/README.md`, "SWA
eviction"), and `evict_subtree` (drop a whole unlocked subtree now).

Phase 1 (full), only when `full_num_tokens > 0`: walk the full LRU list from its least recent end over
unlocked leaves; free each leaf (full + SWA slots, counted on both sides), then cascade upward over parents
that are now childless, unlocked tombstones (full slots only; S4: no leaf is a tombstone). When the deepest
surviving ancestor becomes a leaf, the scan restarts from the least recent end, since that ancestor may be
older than the scan position.

Phase 2 (SWA), only while the SWA slots freed so far are fewer than `swa_num_tokens`: walk the SWA LRU list
(live nodes) from its least recent end over SWA-unlocked nodes. An interior node is tombstoned (SWA slots
freed, full kept); a leaf is deleted like in phase 1. Because a touched path puts ancestors behind their
descendants, root-side nodes become tombstones first and the recent suffix a window needs stays live.

Both phases may over-shoot by one node, and stop short when everything left is locked. Slots are freed in
two batched allocator calls at the end: `free_swa` of the tombstoned nodes, then `free` of the deleted ones
(a node tombstoned and then dropped in the same call is in both; its mapping is 0 by then, so its SWA slots
are not freed twice). Cost: O(nodes scanned) plus the frees; locked nodes are skipped, not removed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cache.errors import EvictLockedError
from cache.swa_node import SWANode


def _is_full_candidate(node: Any) -> bool:
    return node.full_lock_ref == 0 and not node.children


def _is_swa_candidate(node: Any) -> bool:
    return node.swa_lock_ref == 0


def evict_swa_tree(tree: Any, full_num_tokens: int, swa_num_tokens: int) -> tuple[int, int]:
    """Run both phases on `tree` (an SWARadixCache); return `(full_slots_freed, swa_slots_freed)`."""
    frees: list[np.ndarray] = []
    swa_frees: list[np.ndarray] = []
    full_freed = swa_freed = 0

    def delete_leaf(leaf: Any) -> Any:
        nonlocal full_freed, swa_freed
        frees.append(leaf.value)
        full_freed += leaf.num_units
        swa_freed += leaf.num_units  # a leaf is never a tombstone (S4)
        parent = leaf.parent
        tree._remove_leaf(leaf)
        dropped, survivor = tree._drop_tombstone_parents(parent)
        frees.extend(dropped)
        full_freed += sum(v.shape[0] for v in dropped)
        return survivor

    if full_num_tokens > 0:
        lru = tree.full_lru
        node = lru.lru_where(_is_full_candidate)
        while node is not None and full_freed < full_num_tokens:
            nxt = lru.prev_where(node.full_link, _is_full_candidate)
            survivor = delete_leaf(node)
            if survivor is not tree.root and not survivor.children:
                nxt = lru.lru_where(_is_full_candidate)
            node = nxt

    if swa_freed < swa_num_tokens:
        lru = tree.swa_lru
        node = lru.lru_where(_is_swa_candidate)
        while node is not None and swa_freed < swa_num_tokens:
            nxt = lru.prev_where(node.swa_link, _is_swa_candidate)
            if node.children:
                swa_frees.append(node.value)
                swa_freed += node.num_units
                tree._tombstone(node)
            elif node.full_lock_ref == 0:
                delete_leaf(node)
            # else: a full-locked leaf always holds an SWA lock too (a lock starts by SWA-locking its
            # node), so it is never a candidate here; skipping keeps the tree safe if that ever changed.
            node = nxt

    if swa_frees:
        tree.allocator.free_swa(np.concatenate(swa_frees))
    if frees:
        tree.allocator.free(np.concatenate(frees))
    return full_freed, swa_freed


class SWAEvictionOps:
    """Mixin for `SWARadixCache`: `evict`, `evict_subtree` and the node removal / tombstoning they share.
    Uses the tree's `root`, `allocator`, LRU lists, `_path` and size counters."""

    def evict(self, full_num_tokens: int, swa_num_tokens: int = 0) -> tuple[int, int]:
        """Free at least `full_num_tokens` full slots, then, if phase 1 freed fewer than `swa_num_tokens` SWA
        slots, SWA slots by tombstoning. Returns `(full_freed, swa_freed)`; may over-shoot by a node, or fall
        short when the rest is locked. See `cache.swa_eviction` for the phases. Disabled tree: (0, 0)."""
        if self.disabled:
            return 0, 0
        return evict_swa_tree(self, full_num_tokens, swa_num_tokens)

    def evict_subtree(self, node: SWANode) -> int:
        """Drop `node` and everything below it now, freeing their slots; returns the full slots freed.

        Raises EvictLockedError (tree unchanged) if any of those nodes is full-locked, LockError if `node` is
        not in this tree. The root means "everything". A parent tombstone left without children is dropped
        too (S4). O(subtree).
        """
        self._path(node)
        top_parent = node.parent if node is not self.root else None
        nodes = [node] if node is not self.root else []
        nodes.extend(node.iter_below())
        locked = sum(1 for n in nodes if n.full_lock_ref > 0)
        if locked:
            raise EvictLockedError(f"cannot evict: {locked} node(s) at or below {node!r} are locked")
        to_free = [n.value for n in nodes]
        for n in reversed(nodes):  # children before parents
            self._remove_leaf(n)
        if top_parent is not None:
            to_free.extend(self._drop_tombstone_parents(top_parent)[0])
        freed = sum(v.shape[0] for v in to_free)
        if to_free:
            self.allocator.free(np.concatenate(to_free))
        return freed

    def _remove_leaf(self, leaf: SWANode) -> None:
        """Unlink a childless node from the tree and both lists, with its accounting (no freeing)."""
        parent = leaf.parent
        del parent.children[leaf.child_key(self.page_size)]
        self.full_lru.remove(leaf.full_link)
        self._full_evictable -= leaf.num_units
        if not leaf.tombstone:
            self.swa_lru.remove(leaf.swa_link)
            self._swa_evictable -= leaf.num_units
        leaf.parent = None

    def _drop_tombstone_parents(self, parent: SWANode) -> tuple[list[np.ndarray], SWANode]:
        """Cascade (S4): remove `parent` and its ancestors while each is an unlocked, childless tombstone.
        Returns their full slot arrays, for the caller to free (their SWA side is already gone), and the
        deepest ancestor left in the tree."""
        dropped = []
        root = self.root
        while parent is not root and parent.tombstone and not parent.children and not parent.full_lock_ref:
            grand = parent.parent
            dropped.append(parent.value)
            self._remove_leaf(parent)
            parent = grand
        return dropped, parent

    def _tombstone(self, node: SWANode) -> None:
        """Mark a live, SWA-unlocked interior node as a tombstone (the caller frees its SWA slots)."""
        self.swa_lru.remove(node.swa_link)
        node.tombstone = True
        self._swa_evictable -= node.num_units

