"""LRU order over evictable leaves: a lazy min-heap keyed by (last_access, node id).

The tree pushes a node whenever it may have become an evictable leaf or an evictable leaf's `last_access`
changed (new leaf, touched leaf, unlocked leaf, parent left childless). Entries are never removed eagerly:
`pop_lru` discards entries whose node is no longer an evictable leaf or whose stamp is stale. So each tree
event costs O(log n), each eviction O(log n) amortized, and no call scans the whole tree (SGLang instead
collects every leaf on each `evict` call). The heap is rebuilt from its live entries when stale ones outnumber
them, which keeps its size O(number of nodes).
"""

from __future__ import annotations

import heapq

from cache.node import TreeNode


class LeafHeap:
    """Least-recently-used evictable leaf first; ties broken by node id (creation order)."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, TreeNode]] = []

    def __len__(self) -> int:
        return len(self._heap)

    def clear(self) -> None:
        self._heap.clear()

    def push_if_evictable(self, node: TreeNode) -> None:
        """Record `node` at its current `last_access` if it is an evictable leaf now. O(log n)."""
        if node.is_evictable_leaf:
            heapq.heappush(self._heap, (node.last_access, node.id, node))

    def pop_lru(self) -> TreeNode | None:
        """Remove and return the least recently used evictable leaf, or None if there is none."""
        heap = self._heap
        while heap:
            stamp, _, node = heapq.heappop(heap)
            if node.is_evictable_leaf and node.last_access == stamp:
                return node
        return None

    def compact(self, num_nodes: int) -> None:
        """Drop stale entries once they clearly dominate (amortized O(1) per push)."""
        if len(self._heap) > 2 * num_nodes + 1024:
            self._heap = [e for e in self._heap if e[2].is_evictable_leaf and e[2].last_access == e[0]]
            heapq.heapify(self._heap)
