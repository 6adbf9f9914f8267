"""The hybrid prefix tree for models that mix full-attention and sliding-window (SWA) layers.

Every node holds full-attention slots; the allocator maps each full slot to an SWA slot that holds the SWA
layers' KV of the same position. SWA memory is scarcer, so SWA eviction may *tombstone* an interior node:
its SWA KV is freed (mapping -> 0) while its full KV stays. A prefix is reusable only if the SWA layers still
see a whole window of history before the first new token, hence the sliding-window match rule:
a match may end at node N only if the path root..N has no tombstone, or the live nodes after its last
tombstone hold at least `sliding_window` units; otherwise it falls back to just before that tombstone.

Behaviour follows SGLang 0.5.3.post1's `SWARadixCache` with PR #11231 (EAGLE bigram keys; the rules are in
`cache/README.md`, "SWA tree: data model" to "SWA request operations"): two intrusive LRU lists (full: all
nodes, SWA: live nodes) ordered so that ancestors are older than the descendants on a touched path (SWA
eviction tombstones root-side nodes first), `insert` frees the caller's duplicates beyond `prev_prefix_len`
itself and revives tombstones it overlaps. The request operations insert (and re-match) even when a request
computed no new whole page, as SGLang does, so its path is refreshed in both lists; skipping that could
tombstone a node a request still shares instead of evicting an older leaf. This file holds the data
model, match, insert and split; swa_uuid locks are in `cache.swa_locks`, the two-phase
`evict(full_num_tokens, swa_num_tokens)` in `cache.swa_eviction`, the request-level operations in
`cache.request_ops` (shared with the plain tree; this tree's part in `cache.swa_requests`), and
`check_invariants` in `cache.swa_invariants`.

Units: lengths are key *units*: tokens, or EAGLE bigrams when `eagle=True` (a key of `n` tokens has `n - 1`
units, unit `i` holding the slot of token `i`). Slots are *full* slot ids; `page_size = P > 1` makes every
node whole pages and floors matches to pages. The window `sliding_window` is in units too.

Deliberate differences from SGLang (each keeps the ownership rule G1/G2 where SGLang breaks it):
- Tombstone revival keeps the node's full slots and moves the caller's fresh SWA slots behind them
  (`allocator.move_swa`), then frees the caller's now redundant full slots. SGLang 0.5.3.post1 instead freed
  the node's old full slots, which a live request beyond its window may still read. Matched lengths
  and accounting are the same.
- `insert` never frees a caller slot equal to the node's own slot at that position (a caller that passes back
  slots it matched, with `prev_prefix_len=0`, loses nothing); revival needs slots that all differ.
- A tombstone partly below `prev_prefix_len` is split there and only the part at or beyond it is revived.
- Keys are immutable (no in-place bigram conversion); `reset` frees the tree's slots; bad input raises
  before anything changes; the match rule resets its window counter at every tombstone (as later SGLang).
Not thread-safe: one scheduler thread owns the tree.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterator, Sequence

import numpy as np

from cache.allocator import SWASlotAllocator
from cache.errors import ValueLengthError
from cache.keys import RadixKey, check_page_aligned, tree_key, tree_key_and_bytes
from cache.lru_list import LRUList
from cache.match import MatchResult, common_units
from cache.node_base import _TOKEN_BYTES, drop_all
from cache.slots import EMPTY_SLOTS, as_slot_array, check_slots
from cache.swa_eviction import SWAEvictionOps
from cache.swa_export import export_swa, import_swa
from cache.swa_invariants import check_swa_invariants
from cache.swa_locks import SWALockOps
from cache.swa_node import SWANode
from cache.swa_pretty import format_swa_tree
from cache.swa_requests import SWARequestOps
from cache.tree_state import TreeState


class SWARadixCache(SWALockOps, SWAEvictionOps, SWARequestOps):
    """Host-side hybrid prefix tree (full + sliding-window KV). See the module docstring.

    `allocator` implements `SWASlotAllocator` with the same `page_size`. `sliding_window` (units, >= 1) is the
    SWA layers' window. `disabled=True` keeps the API but caches nothing (request operations free directly).
    """

    def __init__(
        self,
        allocator: SWASlotAllocator,
        *,
        sliding_window: int,
        page_size: int = 1,
        eagle: bool = False,
        disabled: bool = False,
    ) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1 unit, got {sliding_window}")
        if allocator.page_size != page_size:
            raise ValueError(f"allocator has page_size={allocator.page_size}, the tree {page_size}")
        self.allocator = allocator
        self.sliding_window = int(sliding_window)
        self.page_size = page_size
        self.eagle = bool(eagle)
        self.disabled = bool(disabled)
        self._clear()

    def _clear(self) -> None:
        self.root = SWANode(RadixKey(np.zeros(0, np.int64), self.eagle), EMPTY_SLOTS, None)
        self.root.full_lock_ref = self.root.swa_lock_ref = 1  # never evicted (G3), in no LRU list
        self.full_lru = LRUList()  # every non-root node (S2)
        self.swa_lru = LRUList()  # every non-root live (non-tombstone) node (S3)
        self._full_evictable = self._swa_evictable = 0
        self._full_protected = self._swa_protected = 0

    # ------------------------------------------------------------------ accounting
    @property
    def full_evictable_size(self) -> int:
        """Units (= full slots) held by nodes with `full_lock_ref == 0`."""
        return self._full_evictable

    @property
    def full_protected_size(self) -> int:
        """Units (= full slots) held by nodes with `full_lock_ref > 0`."""
        return self._full_protected

    @property
    def swa_evictable_size(self) -> int:
        """Units (= SWA slots) held by live (non-tombstone) nodes with `swa_lock_ref == 0`."""
        return self._swa_evictable

    @property
    def swa_protected_size(self) -> int:
        """Units (= SWA slots) held by live nodes with `swa_lock_ref > 0`."""
        return self._swa_protected

    @property
    def num_nodes(self) -> int:
        """Non-root nodes in the tree (tombstones included)."""
        return len(self.full_lru)

    def total_size(self) -> int:
        """Full slots held by the whole tree (tombstones included). O(nodes); for tests and debugging."""
        return sum(node.num_units for node in self.iter_nodes())

    def total_swa_size(self) -> int:
        """SWA slots held by the tree: units of live (non-tombstone) nodes. O(nodes)."""
        return sum(node.num_units for node in self.iter_nodes() if not node.tombstone)

    def iter_nodes(self) -> Iterator[SWANode]:
        """Every non-root node, parents before children (O(nodes))."""
        return self.root.iter_below()

    def reset(self) -> None:
        """Drop every node and free its slots (full, and SWA where live). Raises EvictLockedError (tree
        unchanged) while any request holds a lock."""
        nodes = list(self.iter_nodes())
        drop_all(self.allocator, nodes, sum(1 for n in nodes if n.full_lock_ref > 0))
        self._clear()

    # ------------------------------------------------------------------ keys
    def make_key(
        self, token_ids: Sequence[int] | np.ndarray | RadixKey, extra_key: Hashable | None = None
    ) -> RadixKey:
        """The tree's view of `token_ids`: validated, bigram when `eagle` (idempotent), in `extra_key`'s
        namespace. A given RadixKey keeps its own namespace; passing a different `extra_key` raises."""
        return tree_key(token_ids, extra_key, eagle=self.eagle)

    def _child_key(self, token_bytes: bytes, pos: int, extra_key: Hashable | None) -> Hashable:
        start = pos * _TOKEN_BYTES
        head = token_bytes[start : start + (self.page_size + self.eagle) * _TOKEN_BYTES]
        return head if extra_key is None else (extra_key, head)

    def _common_units(
        self, child: SWANode, tokens: np.ndarray, token_bytes: bytes, pos: int, num_units: int
    ) -> int:
        """`common_units`, with one memcmp when the whole node matches (the usual case on a shared path)."""
        if child.num_units <= num_units - pos and token_bytes.startswith(child.key_bytes, pos * _TOKEN_BYTES):
            return child.num_units
        return common_units(child, tokens, token_bytes, pos, num_units, self.eagle, self.page_size)

    # ------------------------------------------------------------------ LRU helpers
    def _touch(self, node: SWANode) -> None:
        """Move one node to the MRU end of the full list, and of the SWA list when live."""
        self.full_lru.move_to_mru(node.full_link)
        if not node.tombstone:
            self.swa_lru.move_to_mru(node.swa_link)

    def _touch_path(self, node: SWANode) -> None:
        """Make `node` and its ancestors the most recent members, `node` first and each parent right after
        its child, so that root-side nodes are evicted first (SWA list: live nodes only). O(depth)."""
        full_anchor = swa_anchor = None
        while node is not self.root:
            self.full_lru.move_after(full_anchor, node.full_link)
            full_anchor = node.full_link
            if not node.tombstone:
                self.swa_lru.move_after(swa_anchor, node.swa_link)
                swa_anchor = node.swa_link
            node = node.parent

    # ------------------------------------------------------------------ match
    def match_prefix(
        self, token_ids: Sequence[int] | np.ndarray | RadixKey, extra_key: Hashable | None = None
    ) -> MatchResult:
        """Longest cached prefix that obeys the sliding-window rule, floored to pages: its slots (a fresh
        array, still owned by the tree) and deepest node.

        Splits the node where the walk ends inside one (even when the window rule then answers shorter),
        refreshes the LRU order of the answer's path; never frees or allocates. Under EAGLE a key of n
        tokens matches at most n - 1 slots. Cost: O(nodes visited) plus C-speed compares of matched tokens.
        """
        return self._match(*tree_key_and_bytes(token_ids, extra_key, eagle=self.eagle))

    def _match(self, key: RadixKey, token_bytes: bytes) -> MatchResult:
        """`match_prefix` of a prepared key (`token_bytes` are its tokens' bytes)."""
        slots, path = self._match_path(key, token_bytes)
        return MatchResult(slots, path[-1] if path else self.root)

    def _match_path(self, key: RadixKey, token_bytes: bytes) -> tuple[np.ndarray, list[SWANode]]:
        """`_match`, answering the matched node's root path (root's child first; empty: the root)."""
        num_units = len(key) - len(key) % self.page_size
        if self.disabled or num_units == 0:
            return EMPTY_SLOTS.copy(), []
        bigram, extra_key = self.eagle, key.extra_key
        tokens = key.tokens[: num_units + bigram]
        token_bytes = token_bytes[: (num_units + bigram) * _TOKEN_BYTES]
        head_bytes = (self.page_size + bigram) * _TOKEN_BYTES
        window = self.sliding_window
        node, pos, path = self.root, 0, []
        since = math.inf  # live units since the last tombstone on the path; inf while there is none
        best_len = 0  # the answer so far: how many nodes of `path`
        while pos < num_units:
            start = pos * _TOKEN_BYTES
            head = token_bytes[start : start + head_bytes]
            child = node.children.get(head if extra_key is None else (extra_key, head))
            if child is None:
                break
            if child.tombstone:
                if since >= window:
                    best_len = len(path)
                since = 0
            if child.num_units <= num_units - pos and token_bytes.startswith(child.key_bytes, start):
                m = child.num_units  # the whole node matches: one memcmp
            else:
                m = common_units(child, tokens, token_bytes, pos, num_units, bigram, self.page_size)
            ends_inside = m < child.num_units
            if ends_inside:
                child = self._split(child, m)
            path.append(child)
            if not child.tombstone:
                since += m
            node, pos = child, pos + m
            if ends_inside:
                break
        if since >= window:
            best_len = len(path)
        del path[best_len:]
        self._touch_path(path[-1] if path else self.root)
        if not path:
            return EMPTY_SLOTS.copy(), path
        if len(path) == 1:
            return path[0].value.copy(), path
        return np.concatenate([n.value for n in path]), path

    def _match_and_lock(self, key: RadixKey, token_bytes: bytes) -> tuple[np.ndarray, SWANode, int | None]:
        """`_match` then `inc_lock_ref` of its node, locking the matched path without walking it again.
        Returns (slots, node, lock id)."""
        slots, path = self._match_path(key, token_bytes)
        if not path:
            return slots, self.root, None  # locking the root is a no-op
        return slots, path[-1], self._lock_path(path, path[-1])

    # ------------------------------------------------------------------ insert
    def insert(
        self,
        token_ids: Sequence[int] | np.ndarray | RadixKey,
        slots: Sequence[int] | np.ndarray,
        extra_key: Hashable | None = None,
        *,
        prev_prefix_len: int = 0,
    ) -> int:
        """Cache `slots` under the key; return how many leading units were already in the tree.

        Ownership: `slots[:prev_prefix_len]` (floored to pages) are the tree's own, matched earlier; the
        rest are the caller's, with their SWA slots mapped. For each unit the tree already holds, the caller's
        slot is a duplicate and is freed here (full + SWA), unless it is the node's own slot. A tombstone
        overlapped beyond `prev_prefix_len` is revived: it keeps its full slots, takes over the caller's SWA
        slots, and the caller's full slots there are freed. New units become a leaf that takes the caller's
        slots. Under EAGLE, slots beyond the key's units (R4) are neither stored nor freed: the caller frees
        them. The key must be whole pages; `slots` one per unit (one more allowed under EAGLE), whole ordered
        pages.
        Bad input raises before any change. Disabled tree: stores and frees nothing, returns 0.
        """
        key, token_bytes = tree_key_and_bytes(token_ids, extra_key, eagle=self.eagle)
        return self._insert(key, token_bytes, slots, prev_prefix_len)

    def _insert(
        self,
        key: RadixKey,
        token_bytes: bytes,
        slots: Sequence[int] | np.ndarray,
        prev_prefix_len: int,
        path: Sequence[SWANode] = (),
    ) -> int:
        """`insert` of a prepared key (`token_bytes` are its tokens' bytes). `path` (root's child first) must
        be nodes whose keys are the key's first units, `prev_prefix_len` of them (a request's checked locked
        path, `_admission_path`): they are touched as the walk would touch them (their units are the tree's,
        nothing to free or revive) and the walk goes on from the last; only the slots after them are
        validated."""
        slots = as_slot_array(slots)
        num_units = len(key)
        check_page_aligned(num_units, self.page_size, "inserted key")
        if slots.shape[0] != num_units and not (self.eagle and slots.shape[0] == key.num_tokens):
            raise ValueLengthError(
                f"key has {num_units} units ({key.num_tokens} tokens) but {slots.shape[0]} slots were given"
            )
        slots = slots[:num_units]
        check_slots(slots[prev_prefix_len:] if path else slots, self.page_size)
        if prev_prefix_len < 0:
            raise ValueError(f"prev_prefix_len must be >= 0, got {prev_prefix_len}")
        if self.disabled or num_units == 0:
            return 0
        prev = prev_prefix_len - prev_prefix_len % self.page_size
        tokens = key.tokens
        node, pos, to_free = self.root, 0, []
        for node in path:  # whole nodes below `prev`: a touch each, as in the loop below
            self._touch(node)
            pos += node.num_units
        while pos < num_units:
            child = node.children.get(self._child_key(token_bytes, pos, key.extra_key))
            if child is None:
                break
            self._touch(child)
            m = self._common_units(child, tokens, token_bytes, pos, num_units)
            if m < child.num_units:
                child = self._split(child, m)
            if prev < pos + m:
                first = max(prev - pos, 0)
                if child.tombstone and first:
                    node, pos, m = self._split(child, first), prev, m - first  # revive only from `prev` on
                    first = 0
                self._overlap(child, slots[pos + first : pos + m], first, to_free)
            node, pos = child, pos + m
        num_cached = pos
        if pos < num_units:
            self._add_leaf(node, key.units(pos), slots[pos:num_units].copy())
        if to_free:
            self.allocator.free(np.concatenate(to_free))
        return num_cached

    def _overlap(self, node: SWANode, fresh: np.ndarray, first: int, to_free: list[np.ndarray]) -> None:
        """The caller computed units `node.value[first:]` again, into `fresh`: revive or free duplicates."""
        differ = fresh != node.value[first:]
        if node.tombstone and first == 0 and differ.all():
            self.allocator.move_swa(fresh, node.value)
            to_free.append(fresh)  # now unmapped: frees full slots only
            node.tombstone = False
            self.swa_lru.push_mru(node.swa_link)
            self._swa_evictable += node.num_units  # a tombstone holds no SWA lock (S5)
        elif differ.any():
            to_free.append(fresh[differ])

    def _add_leaf(self, parent: SWANode, key: RadixKey, value: np.ndarray) -> SWANode:
        leaf = SWANode(key, value, parent)
        parent.children[leaf.child_key(self.page_size)] = leaf
        self.full_lru.push_mru(leaf.full_link)
        self.swa_lru.push_mru(leaf.swa_link)
        self._full_evictable += leaf.num_units
        self._swa_evictable += leaf.num_units
        return leaf

    def _split(self, child: SWANode, num_units: int) -> SWANode:
        """Cut `child` after `num_units` units; return the new upper node. `child` stays the lower part (so a
        request's `last_node` keeps meaning the same path). Both halves keep the lock counts and the tombstone
        flag; the swa_uuid moves up (a later unlock from below stops at the same node). Accounting is
        unchanged. LRU: upper, then child, become MRU."""
        parent = child.parent
        old_child_key = child.child_key(self.page_size)
        upper = SWANode(child.key.units(0, num_units), child.value[:num_units], parent, child.tombstone)
        upper.full_lock_ref, upper.swa_lock_ref = child.full_lock_ref, child.swa_lock_ref
        upper.swa_uuid, child.swa_uuid = child.swa_uuid, None
        child.key = child.key.units(num_units)
        child.key_bytes = child.key_bytes[num_units * _TOKEN_BYTES :]
        child.value = child.value[num_units:]
        child.num_units -= num_units
        child.parent = upper
        upper.children[child.child_key(self.page_size)] = child
        parent.children[old_child_key] = upper
        self.full_lru.remove(child.full_link)
        self.full_lru.push_mru(upper.full_link)
        self.full_lru.push_mru(child.full_link)
        if not child.tombstone:
            self.swa_lru.remove(child.swa_link)
            self.swa_lru.push_mru(upper.swa_link)
            self.swa_lru.push_mru(child.swa_link)
        return upper

    # ------------------------------------------------------------------ export / import
    def export_state(self) -> TreeState:
        """The tree as plain data: nodes parent-first (keys, full slots, parents, tombstone flags) and
        both LRU orders (`cache.tree_state`). Raises StateError while any node is locked. The tree is
        unchanged."""
        return export_swa(self)

    def import_state(self, state: TreeState) -> None:
        """Rebuild an exported tree in this empty one (same page size, key mode and window), taking
        ownership of `state.slots`: allocated in this tree's allocator and owned by nobody else, a live
        node's mapped to SWA slots, a tombstone's to none (`cache.state_slots`). Afterwards this tree
        behaves as the exported one did (`cache.swa_export`). Raises StateError, changing nothing, on a
        state that is invalid or does not fit."""
        import_swa(self, state)

    # ------------------------------------------------------------------ debugging
    def check_invariants(self, live_reqs=()) -> dict[str, int]:
        """Prove G1/G2 on the full and SWA sides, S1-S7 and the accounting (see `cache.swa_invariants`)."""
        return check_swa_invariants(self, live_reqs)

    def pretty(self, max_units: int = 8) -> str:
        """A multi-line drawing of the tree: key units, slots, lock counts, TOMBSTONE flags and swa_uuids."""
        return format_swa_tree(self, max_units)

    def __repr__(self) -> str:
        return (
            f"SWARadixCache(sliding_window={self.sliding_window}, page_size={self.page_size}, "
            f"eagle={self.eagle}, disabled={self.disabled}, nodes={self.num_nodes}, "
            f"full_evictable={self._full_evictable}, full_protected={self._full_protected}, "
            f"swa_evictable={self._swa_evictable}, swa_protected={self._swa_protected})"
        )
