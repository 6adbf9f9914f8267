"""`SWARadixCache.evict(full_num_tokens, swa_num_tokens)`: the two eviction phases (reference doc §14).

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
