"""`TreeState`: a prefix tree as plain numpy / Python data, what `export_state()` returns and
`import_state()` takes on both trees (warm restart, tests).

Nodes are numbered parent-first: `parents[i]` is node i's parent (-1: the root) and always `< i`; siblings
appear in their parent's children order. Node i's key tokens are `tokens[token_offsets[i]:token_offsets[i+1]]`
(under EAGLE a bigram key of `u` units has `u + 1` tokens, the first equal to its parent's last one) in the
namespace `extra_keys[i]`; its *full* slot ids are `slots[slot_offsets[i]:slot_offsets[i+1]]`, one per unit.
`full_lru` lists every node, least recently used first: the order in which eviction would consider them.
The SWA tree's state also has `sliding_window` (units), `tombstone` (node i lost its SWA KV and keeps only
its full slots) and `swa_lru` (the live nodes, least recently used first); the plain tree's has None there.
SWA slots are not part of the state: they live behind the full slots in the allocator's mapping.

A state holds no locks: export refuses a tree with locked nodes, and lock ids (`swa_uuid`) are not kept.
`check()` proves the state describes a valid tree on its own; the trees check the rest (allocator,
emptiness) before `import_state` changes anything.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable

import numpy as np

from cache.errors import CacheError, StateError
from cache.keys import MAX_TOKEN_ID, SLOT_DTYPE
from cache.slots import check_slots


@dataclasses.dataclass(frozen=True, eq=False)
class TreeState:
    """A tree's nodes, slots and LRU order; see the module docstring for the layout. Units are key units
    (tokens, or bigrams when `eagle`); slots are full slot ids (int64)."""

    page_size: int
    eagle: bool
    parents: np.ndarray
    token_offsets: np.ndarray
    tokens: np.ndarray
    extra_keys: tuple[Hashable | None, ...]
    slots: np.ndarray
    full_lru: np.ndarray
    sliding_window: int | None = None
    tombstone: np.ndarray | None = None
    swa_lru: np.ndarray | None = None

    @property
    def num_nodes(self) -> int:
        return int(self.parents.shape[0])

    @property
    def num_units(self) -> np.ndarray:
        """Units (= full slots) of each node, int64 `[num_nodes]`."""
        return np.diff(self.token_offsets) - int(self.eagle)

    @property
    def slot_offsets(self) -> np.ndarray:
        """Where each node's slots start in `slots`, int64 `[num_nodes + 1]`."""
        return np.concatenate([[0], np.cumsum(self.num_units)]).astype(SLOT_DTYPE)

    @property
    def live(self) -> np.ndarray:
        """Bool `[num_nodes]`: the node holds SWA KV (every node of a plain tree's state)."""
        return np.ones(self.num_nodes, bool) if self.tombstone is None else ~self.tombstone

    def node_tokens(self, i: int) -> np.ndarray:
        """Node i's key tokens (a view)."""
        return self.tokens[self.token_offsets[i] : self.token_offsets[i + 1]]

    def with_slots(self, slots: np.ndarray) -> TreeState:
        """The same tree over other full slots (`slots[k]` replaces `self.slots[k]`), e.g. the ones a fresh
        allocator handed out for it (`cache.state_slots.allocate_state_slots`)."""
        slots = np.asarray(slots, SLOT_DTYPE)
        if slots.shape != self.slots.shape:
            raise StateError(f"{slots.shape[0]} slots given for a state of {self.slots.shape[0]}")
        return dataclasses.replace(self, slots=slots)

    def equals(self, other: TreeState) -> bool:
        """Same tree: every field equal (arrays element-wise)."""
        for field in dataclasses.fields(self):
            a, b = getattr(self, field.name), getattr(other, field.name)
            if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
                if a is None or b is None or not np.array_equal(a, b):
                    return False
            elif a != b:
                return False
        return True

    def check(self) -> None:
        """Raise StateError unless this describes a valid tree: parent-first links, keys of at least one
        unit and whole pages that continue their parent (namespace; EAGLE boundary token), distinct child
        keys, whole distinct pages of valid slots, LRU orders that list each (live) node once, no
        tombstone leaf. O(nodes + slots) numpy work plus one Python step per node."""
        n, p, eagle = self.num_nodes, self.page_size, int(self.eagle)
        if p < 1:
            raise StateError(f"page_size must be >= 1, got {p}")
        arrays = (self.parents, self.token_offsets, self.tokens, self.slots, self.full_lru)
        if any(a.ndim != 1 or a.dtype.kind not in "iu" for a in arrays):
            raise StateError("state arrays must be 1-D integer arrays")
        if self.token_offsets.shape[0] != n + 1 or len(self.extra_keys) != n:
            raise StateError(f"{n} nodes need {n + 1} token offsets and {n} extra keys")
        if (n and not (self.parents < np.arange(n)).all()) or (self.parents < -1).any():
            raise StateError("nodes are not parent-first (a parent index is not below its child's)")
        offsets = self.token_offsets
        if offsets[0] != 0 or offsets[-1] != self.tokens.shape[0] or (np.diff(offsets) < 0).any():
            raise StateError("token offsets do not cover the tokens in order")
        if self.tokens.size and (self.tokens.min() < 0 or self.tokens.max() > MAX_TOKEN_ID):
            raise StateError("token ids out of range")
        units = self.num_units
        if (units < 1).any() or (units % p).any():
            raise StateError(f"a node's key is empty or not whole pages of {p} units")
        if self.slots.shape[0] != int(units.sum()):
            raise StateError(f"{self.slots.shape[0]} slots for {int(units.sum())} key units")
        try:
            check_slots(np.asarray(self.slots, SLOT_DTYPE), p)
        except CacheError as exc:
            raise StateError(f"slots: {exc}") from None
        pages = self.slots[::p] // p
        if np.unique(pages).shape[0] != pages.shape[0]:
            raise StateError("a slot (page) belongs to two nodes")
        self._check_links(n, p, eagle)
        if not np.array_equal(np.sort(self.full_lru), np.arange(n)):
            raise StateError("full_lru is not an order of all nodes")
        self._check_swa_fields(n)

    def _check_links(self, n: int, p: int, eagle: int) -> None:
        seen: set[tuple[int, Hashable]] = set()
        for i in range(n):
            parent, toks = int(self.parents[i]), self.node_tokens(i)
            if parent >= 0:
                if self.extra_keys[parent] != self.extra_keys[i]:
                    raise StateError(f"node {i} is in another namespace than its parent")
                if eagle and self.node_tokens(parent)[-1] != toks[0]:
                    raise StateError(f"node {i}'s bigram key does not continue its parent's last token")
            head = (parent, self.extra_keys[i], toks[: p + eagle].tobytes())
            if head in seen:
                raise StateError(f"node {i} has the first page of a sibling")
            seen.add(head)

    def _check_swa_fields(self, n: int) -> None:
        fields = (self.sliding_window, self.tombstone, self.swa_lru)
        if all(f is None for f in fields):
            return
        if any(f is None for f in fields) or self.sliding_window < 1:
            raise StateError("an SWA state needs sliding_window >= 1, tombstone and swa_lru")
        if self.tombstone.shape != (n,) or self.tombstone.dtype != np.bool_:
            raise StateError(f"tombstone must be bool [{n}]")
        has_child = np.zeros(n, bool)
        has_child[self.parents[self.parents >= 0]] = True
        if (self.tombstone & ~has_child).any():
            raise StateError("a tombstone is a leaf")
        if self.swa_lru.ndim != 1 or not np.array_equal(np.sort(self.swa_lru), np.flatnonzero(self.live)):
            raise StateError("swa_lru is not an order of the live nodes")
