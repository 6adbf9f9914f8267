"""Test helper: a brute-force model of SGLang 0.5.3.post1's plain radix tree, for its LRU stamps and eviction
order only. Not a test module.

Representation (no tree objects): a *page* is a tuple of `page_size` units (token ids, or bigram pairs
under EAGLE); `slot` maps every cached page prefix (a tuple of pages) to the slots of its last page;
`stamp` / `lock` are keyed by the page prefix at which a node ends (its *end*). A node's pages are those
between the nearest shorter end on its path (or the root) and its end. Everything is recomputed by scanning
these dicts, O(cached pages) per question.

Stamping, as SGLang does it with `time.monotonic()` (a counter here, one tick per stamp):
- match and insert stamp every node the walk enters, in walk order (root first, then deeper nodes);
- a walk that stops inside a node stamps that node first and then splits it: the new upper half is created
  after the stamp, so it is one tick more recent than the lower half;
- insert then creates the leaf for the uncached rest, the most recent of all.
Eviction collects every unlocked leaf, takes them oldest stamp first, and a parent left without children
joins the candidates in the same call; it stops once the freed slots reach the request.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from itertools import pairwise

Prefix = tuple


class SGLangLRUModel:
    """Plain-tree model: `match`, `insert`, `evict`, `lock`, `unlock` (ends stand in for nodes)."""

    def __init__(self, page_size: int, eagle: bool) -> None:
        self.page_size, self.eagle = page_size, eagle
        self.slot: dict[Prefix, tuple[int, ...]] = {}
        self.stamp: dict[Prefix, int] = {}
        self.lock: dict[Prefix, int] = {}
        self.tick = 0

    def pages(self, tokens: Sequence[int]) -> list[tuple]:
        """The whole pages of units of `tokens` (a partial last page is dropped)."""
        ids = [int(t) for t in tokens]
        units = list(pairwise(ids)) if self.eagle else ids
        p = self.page_size
        return [tuple(units[i : i + p]) for i in range(0, len(units) - p + 1, p)]

    # ------------------------------------------------------------------ derived structure
    def _node_end(self, prefix: Prefix) -> Prefix:
        """The end of the node holding the last unit of `prefix` (a cached prefix)."""
        ends = [e for e in self.stamp if len(e) >= len(prefix) and e[: len(prefix)] == prefix]
        return min(ends, key=len)

    def _parent_end(self, end: Prefix) -> Prefix:
        return max((e for e in self.stamp if len(e) < len(end) and end[: len(e)] == e), key=len, default=())

    def _is_leaf(self, end: Prefix) -> bool:
        return not any(len(p) == len(end) + 1 and p[: len(end)] == end for p in self.slot)

    def _cached_len(self, pages: list[tuple]) -> int:
        n = 0
        while n < len(pages) and tuple(pages[: n + 1]) in self.slot:
            n += 1
        return n

    def _stamp(self, end: Prefix) -> None:
        self.tick += 1
        self.stamp[end] = self.tick

    def _walk(self, pages: list[tuple]) -> tuple[int, Prefix]:
        """Stamp the nodes a walk along `pages` enters, split where it stops inside one; returns the matched
        pages and the end of the deepest node reached (() for the root)."""
        self.tick += 1  # the root's stamp (the root is never evicted)
        matched = self._cached_len(pages)
        end: Prefix = ()
        while len(end) < matched:
            end = self._node_end(tuple(pages[: len(end) + 1]))
            self._stamp(end)
        if len(end) > matched:  # stopped inside a node: the upper half is a new node, one tick newer
            upper = tuple(pages[:matched])
            self.lock[upper] = self.lock[end]
            self._stamp(upper)
            end = upper
        return matched, end

    # ------------------------------------------------------------------ operations
    def match(self, tokens: Sequence[int]) -> tuple[list[int], Prefix]:
        """The cached slots of the longest prefix of whole pages, and the end of the node reached."""
        pages = self.pages(tokens)
        if not pages:
            return [], ()
        matched, end = self._walk(pages)
        return [s for i in range(matched) for s in self.slot[tuple(pages[: i + 1])]], end

    def insert(self, tokens: Sequence[int], slots: Sequence[int]) -> int:
        """`tokens` must give whole pages of units; `slots` one per unit (extra ones are ignored). Returns
        the units already cached."""
        pages, p = self.pages(tokens), self.page_size
        if not pages:
            return 0
        matched, _ = self._walk(pages)
        if matched < len(pages):
            for i in range(matched, len(pages)):
                self.slot[tuple(pages[: i + 1])] = tuple(int(s) for s in slots[i * p : (i + 1) * p])
            leaf = tuple(pages)
            self.lock[leaf] = 0
            self._stamp(leaf)
        return matched * p

    def lock_path(self, end: Prefix, delta: int) -> None:
        for e in list(self.stamp):
            if len(e) <= len(end) and end[: len(e)] == e:
                self.lock[e] += delta

    def evict(self, num_tokens: int) -> list[list[int]]:
        """The slots of every evicted node, in eviction order."""
        heap = [(self.stamp[e], e) for e in self.stamp if self._is_leaf(e)]
        heapq.heapify(heap)
        freed: list[list[int]] = []
        total = 0
        while total < num_tokens and heap:
            _, end = heapq.heappop(heap)
            if self.lock[end] > 0:
                continue
            parent = self._parent_end(end)
            prefixes = [end[:i] for i in range(len(parent) + 1, len(end) + 1)]
            freed.append([s for p in prefixes for s in self.slot.pop(p)])
            total += len(prefixes) * self.page_size
            del self.stamp[end], self.lock[end]
            if parent and self._is_leaf(parent):
                heapq.heappush(heap, (self.stamp[parent], parent))
        return freed

    def as_dicts(self) -> tuple[dict[Prefix, tuple[int, ...]], list[Prefix]]:
        """Every cached page prefix -> its slots, and the node ends from least to most recently stamped."""
        return dict(self.slot), sorted(self.stamp, key=self.stamp.__getitem__)
