"""The plain (full-attention) prefix tree: token prefixes -> the full slots that hold their KV.

Behaviour follows SGLang 0.5.3.post1's `RadixCache` (the rules are in `cache/README.md`, "Matching" to "Locks
and eviction"): `match_prefix` splits nodes and refreshes LRU stamps, `insert` returns how much of the key was
already cached (the caller owns those duplicate slots), eviction removes least-recently-used unlocked leaves
and cascades to parents that become leaves, and `inc_lock_ref` / `dec_lock_ref` move whole root paths between
the evictable and protected counts. The request-level operations (`admit`, `cache_unfinished_req`,
`cache_finished_req`, `release_req`) are shared with the SWA tree (`cache.request_ops`); this tree's part is
in `cache.radix_requests`, correct where SGLang is not (see there).

Units: all lengths are key *units*: tokens, or EAGLE bigrams when `eagle=True` (then a key of `n` tokens has
`n - 1` units, each holding the slot of its first token). Slots are full-attention slot ids (int64). With
`page_size = P > 1` every node's key and value are whole pages and matches are floored to pages.

LRU order equals SGLang's: every node a match or insert walks into gets a fresh stamp in walk order (a tick
counter stands in for SGLang's monotonic clock, so no two stamps tie); a node the walk stops inside is stamped
and then split, and the new upper half is stamped once more, so both halves become recent and the upper one
is the more recent; a new leaf is the most recent of all; eviction takes unlocked leaves oldest first, a
parent left without children joining the candidates in the same call. The request operations re-insert
(and, for an unfinished request, re-match) even when no new whole page was computed, as SGLang does, so a
request's path is refreshed whenever it is cached.

Deliberate differences from SGLang:
- keys are never converted in place (a `RadixKey` carries its mode);
- `insert` validates its input and rejects keys that are not whole pages instead of storing a partial page;
- `reset` frees the tree's slots to the allocator (SGLang leaves that to the caller's allocator reset);
- the LRU order is kept in a lazy heap of leaves (`cache.eviction`) instead of collecting every leaf on
  each `evict`: same order, cost proportional to the nodes touched;
- the request operations differ where SGLang breaks slot ownership (`cache.radix_requests`), and a
  `cache_unfinished_req` covering fewer units than the request's last match (nothing computed since) changes
  nothing, where SGLang would move the lock up to the shorter match.
Not thread-safe: one scheduler thread owns the tree.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence

import numpy as np

from cache.allocator import SlotAllocator
from cache.errors import EvictLockedError, LockError, ValueLengthError
from cache.eviction import LeafHeap
from cache.keys import RadixKey, check_page_aligned, tree_key, tree_key_and_bytes
from cache.match import MatchResult, common_units
from cache.node import TreeNode
from cache.node_base import _TOKEN_BYTES, drop_all
from cache.pretty import format_tree
from cache.radix_invariants import check_radix_invariants
from cache.radix_requests import RadixRequestOps
from cache.slots import EMPTY_SLOTS, as_slot_array, check_slots
from cache.tree_export import export_radix, import_radix
from cache.tree_state import TreeState


class RadixCache(RadixRequestOps):
    """Host-side prefix tree over full-attention slots. See the module docstring for units and semantics.

    `allocator` must be page-granular with the same `page_size`; the tree frees evicted slots through it.
    `disabled=True` keeps the same API but caches nothing (matches are empty, inserts store nothing, the
    request operations free KV directly).
    """

    def __init__(
        self, allocator: SlotAllocator, *, page_size: int = 1, eagle: bool = False, disabled: bool = False
    ) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if allocator.page_size != page_size:
            raise ValueError(f"allocator has page_size={allocator.page_size}, the tree {page_size}")
        self.allocator = allocator
        self.page_size = page_size
        self.eagle = bool(eagle)
        self.disabled = bool(disabled)
        self._clear()

    def _clear(self) -> None:
        self._tick = 0
        self.root = TreeNode(RadixKey(np.zeros(0, np.int64), self.eagle), EMPTY_SLOTS, None, 0)
        self.root.lock_ref = 1  # never evicted (G3); locks stop below it
        self._evictable_size = 0
        self._protected_size = 0
        self._num_nodes = 0
        self._lru = LeafHeap()

    # ------------------------------------------------------------------ accounting
    @property
    def evictable_size(self) -> int:
        """Units (= slots) held by nodes with `lock_ref == 0`."""
        return self._evictable_size

    @property
    def protected_size(self) -> int:
        """Units (= slots) held by locked nodes (some live request's prefix)."""
        return self._protected_size

    @property
    def num_nodes(self) -> int:
        """Non-root nodes in the tree."""
        return self._num_nodes

    def total_size(self) -> int:
        """Units held by the whole tree, summed over nodes (O(nodes); for tests and debugging)."""
        return sum(node.num_units for node in self.iter_nodes())

    def iter_nodes(self) -> Iterator[TreeNode]:
        """Every non-root node, parents before children (O(nodes))."""
        return self.root.iter_below()

    def reset(self) -> None:
        """Drop every node and free its slots to the allocator. Raises EvictLockedError (tree unchanged) while
        any request holds a lock."""
        nodes = list(self.iter_nodes())
        drop_all(self.allocator, nodes, sum(1 for n in nodes if n.lock_ref > 0))
        self._clear()

    # ------------------------------------------------------------------ keys
    def make_key(
        self, token_ids: Sequence[int] | np.ndarray | RadixKey, extra_key: Hashable | None = None
    ) -> RadixKey:
        """The tree's view of `token_ids`: validated, bigram when `eagle` (idempotent), in `extra_key`'s
        namespace. A given RadixKey keeps its own namespace; passing a different `extra_key` raises."""
        return tree_key(token_ids, extra_key, eagle=self.eagle)

    # ------------------------------------------------------------------ match / insert
    def _walk(
        self, key: RadixKey, token_bytes: bytes, num_units: int, path: Sequence[TreeNode] = ()
    ) -> tuple[TreeNode, int, list[TreeNode]]:
        """Follow the key's first `num_units` units (whole pages) down the tree, splitting the node where the
        common prefix ends inside it and refreshing LRU stamps. Returns the deepest node reached, the units
        matched, and the nodes matched below `path`, in order. `path` (root's child first) must be nodes
        whose keys are the key's first units (`_admission_path`): they are stamped as the walk would stamp
        them and the walk goes on from the last. The hot path of match and insert: per node one
        dict lookup and one memcmp; a vectorised compare only where a node's key diverges."""
        bigram, page_size, extra_key = int(self.eagle), self.page_size, key.extra_key
        tokens, unit_bytes = key.tokens, _TOKEN_BYTES  # offsets below count bytes: unit i at i * 8
        head_bytes = (page_size + bigram) * unit_bytes
        stop = num_units * unit_bytes
        end = stop + bigram * unit_bytes  # the bytes of the first num_units units
        tick = self._tick + 1
        node, start, nodes = self.root, 0, []
        node.last_access = tick
        for node in path:  # whole nodes, in walk order: no split, no lookup
            tick += 1
            node.last_access = tick
            start += node.num_units
        start *= unit_bytes
        while start < stop:
            head = token_bytes[start : start + head_bytes]
            child = node.children.get(head if extra_key is None else (extra_key, head))
            if child is None:
                break
            tick += 1
            child.last_access = tick  # stamped before a split, so both halves are recent (as SGLang)
            if token_bytes.startswith(child.key_bytes, start, end):  # the whole node matches: one memcmp
                m = child.num_units
            else:
                pos = start // unit_bytes
                m = common_units(child, tokens, token_bytes, pos, num_units, bigram, page_size)
                lower = child
                child = self._split(child, m)
                tick += 1
                child.last_access = tick  # the upper half is created after the stamp: more recent
                self._lru.push_if_evictable(lower)  # its stamp changed
            nodes.append(child)
            node = child
            start += m * unit_bytes
        pos = start // unit_bytes
        self._tick = tick
        return node, pos, nodes

    def match_prefix(
        self, token_ids: Sequence[int] | np.ndarray | RadixKey, extra_key: Hashable | None = None
    ) -> MatchResult:
        """Longest cached prefix of the key, floored to whole pages: its slots (fresh array) and deepest node.

        Splits the node where the match ends inside it and refreshes the LRU stamps of the path; never frees
        or allocates. Under EAGLE a key of n tokens matches at most n - 1 slots (R5). Cost: O(nodes visited)
        Python steps plus C-speed compares of the matched tokens.
        """
        return self._match(*tree_key_and_bytes(token_ids, extra_key, eagle=self.eagle))

    def _match(self, key: RadixKey, token_bytes: bytes) -> MatchResult:
        """`match_prefix` of a prepared key (`token_bytes` are its tokens' bytes)."""
        slots, path = self._match_path(key, token_bytes)
        return MatchResult(slots, path[-1] if path else self.root)

    def _match_path(self, key: RadixKey, token_bytes: bytes) -> tuple[np.ndarray, list[TreeNode]]:
        """`_match`, answering the matched node's root path (root's child first; empty: the root)."""
        num_units = len(key) - len(key) % self.page_size
        if self.disabled or num_units == 0:
            return EMPTY_SLOTS.copy(), []
        node, _, path = self._walk(key, token_bytes, num_units)
        self._lru.push_if_evictable(node)
        self._lru.compact(self._num_nodes)
        if not path:
            return EMPTY_SLOTS.copy(), path
        if len(path) == 1:
            return node.value.copy(), path
        return np.concatenate([n.value for n in path]), path

    def _match_and_lock(self, key: RadixKey, token_bytes: bytes) -> tuple[np.ndarray, TreeNode, None]:
        """`_match` then `inc_lock_ref` of its node, locking the walked path without walking it again.
        Returns (slots, node, lock id)."""
        slots, path = self._match_path(key, token_bytes)
        if not path:
            return slots, self.root, None
        self._lock_path(path)
        return slots, path[-1], None

    def insert(
        self,
        token_ids: Sequence[int] | np.ndarray | RadixKey,
        slots: Sequence[int] | np.ndarray,
        extra_key: Hashable | None = None,
        *,
        prev_prefix_len: int = 0,
    ) -> int:
        """Cache `slots` under the key; return how many leading units were already cached.

        Ownership: the tree takes `slots[returned:num_units]` (it copies them). The caller keeps and must free
        the duplicates `slots[prev_prefix_len:returned]` it owns, and under EAGLE any slots beyond the key's
        units (R4: a key of n tokens stores n - 1 slots). `prev_prefix_len` is accepted for API symmetry with
        the SWA tree and otherwise ignored. The key must be whole pages; `slots` must have one slot per unit
        (more is allowed only under EAGLE) and be whole pages in order. Bad input raises before any change.
        Disabled tree: stores nothing, returns 0 (the caller keeps every slot).
        """
        return self._insert(*tree_key_and_bytes(token_ids, extra_key, eagle=self.eagle), slots)

    def _insert(
        self,
        key: RadixKey,
        token_bytes: bytes,
        slots: Sequence[int] | np.ndarray,
        path: Sequence[TreeNode] = (),
        path_units: int = 0,
    ) -> int:
        """`insert` of a prepared key (`token_bytes` are its tokens' bytes). With `path` (see `_walk`) of
        `path_units` units, `slots[:path_units]` are neither stored nor returned as duplicates, so only the
        rest are validated."""
        slots = as_slot_array(slots)
        num_units = len(key)
        check_page_aligned(num_units, self.page_size, "inserted key")
        if slots.shape[0] < num_units or (slots.shape[0] > num_units and not self.eagle):
            raise ValueLengthError(f"key has {num_units} units but {slots.shape[0]} slots were given")
        slots = slots[:num_units]
        check_slots(slots[path_units:], self.page_size)
        if self.disabled or num_units == 0:
            return 0
        node, pos, _ = self._walk(key, token_bytes, num_units, path)
        if pos < num_units:
            self._tick += 1
            leaf_bytes = token_bytes[pos * _TOKEN_BYTES :]  # the bytes of key.units(pos): no second copy
            leaf = TreeNode(key.units(pos), slots[pos:].copy(), node, self._tick, leaf_bytes)
            node.children[leaf.child_key(self.page_size)] = leaf
            self._evictable_size += leaf.num_units
            self._num_nodes += 1
            node = leaf
        self._lru.push_if_evictable(node)
        self._lru.compact(self._num_nodes)
        return pos

    def _split(self, child: TreeNode, num_units: int) -> TreeNode:
        """Cut `child` after `num_units` units; return the new upper node. `child` becomes the lower part so
        that references to it (requests' `last_node`) keep meaning the same path. Accounting is unchanged."""
        parent, cut, bigram, key = child.parent, num_units * _TOKEN_BYTES, self.eagle, child.key
        # views, no copies; under EAGLE the two halves share one boundary token
        upper_key = RadixKey(key.tokens[: num_units + bigram], bigram, key.extra_key)
        upper = TreeNode(
            upper_key,
            child.value[:num_units],
            parent,
            child.last_access,
            child.key_bytes[: cut + bigram * _TOKEN_BYTES],
        )
        upper.lock_ref = child.lock_ref
        parent.children[child.child_key(self.page_size)] = upper  # same first page as before the cut
        child.key = RadixKey(key.tokens[num_units:], bigram, key.extra_key)
        child.key_bytes = child.key_bytes[cut:]
        child.value = child.value[num_units:]
        child.num_units -= num_units
        child.parent = upper
        upper.children[child.child_key(self.page_size)] = child
        self._num_nodes += 1
        return upper

    # ------------------------------------------------------------------ locks
    def _path(self, node: TreeNode) -> list[TreeNode]:
        """`node`'s root path; LockError unless `node` is in this tree."""
        return node.path_below(self.root)

    def inc_lock_ref(self, node: TreeNode) -> None:
        """Lock `node`'s root path against eviction (moves newly locked units evictable -> protected).

        Returns the lock id, always None for the plain tree. O(depth). Locking the root is a no-op.
        """
        if self.disabled:
            return None
        self._lock_path(self._path(node))
        return None

    def _lock_path(self, path: list[TreeNode]) -> None:
        """`inc_lock_ref` on a root path (root's child first) known to be in this tree."""
        for n in path:
            if n.lock_ref == 0:
                self._evictable_size -= n.num_units
                self._protected_size += n.num_units
            n.lock_ref += 1

    def dec_lock_ref(self, node: TreeNode, lock_id: int | None = None) -> None:
        """Undo one `inc_lock_ref(node)`. Raises LockError (tree unchanged) if some node on the path holds no
        lock or `node` is not in the tree. `lock_id` is ignored by the plain tree."""
        if self.disabled:
            return
        self._unlock_path(self._path(node), node, lock_id)

    def _unlock_path(self, path: list[TreeNode], node: TreeNode, lock_id: int | None = None) -> None:
        """`dec_lock_ref(node)` given `node`'s root path (root's child first), already checked to be in this
        tree."""
        if any(n.lock_ref <= 0 for n in path):
            raise LockError(f"unlocking {node!r}, but its path holds no lock")
        for n in path:
            if n.lock_ref == 1:
                self._evictable_size += n.num_units
                self._protected_size -= n.num_units
            n.lock_ref -= 1
        self._lru.push_if_evictable(node)  # the rest of the path are its ancestors: not leaves
        self._lru.compact(self._num_nodes)

    # ------------------------------------------------------------------ eviction
    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` slots by removing least-recently-used unlocked leaves (parents that
        become leaves are candidates in the same call). Returns the slots freed: may exceed the request by
        less than one node, or fall short when everything left is locked. O(evicted nodes * log nodes)."""
        if self.disabled:
            return 0
        evicted, values = 0, []
        while evicted < num_tokens:
            leaf = self._lru.pop_lru()
            if leaf is None:
                break
            values.append(leaf.value)
            evicted += leaf.num_units
            parent = leaf.parent
            self._remove_leaf(leaf)
            self._lru.push_if_evictable(parent)
        if values:  # one allocator call for the whole eviction, slots in eviction order
            self.allocator.free(np.concatenate(values) if len(values) > 1 else values[0])
        return evicted

    def evict_subtree(self, node: TreeNode) -> int:
        """Drop `node` and everything below it now, freeing their slots; returns the slots freed.

        Raises EvictLockedError (tree unchanged) if any of those nodes is locked, LockError if `node` is not
        in this tree. The root means "everything". O(subtree).
        """
        self._path(node)
        nodes = [node] if node is not self.root else []
        nodes.extend(node.iter_below())
        locked = [n for n in nodes if n.lock_ref > 0]
        if locked:
            raise EvictLockedError(f"cannot evict: {len(locked)} node(s) below {node!r} are locked")
        if nodes:
            self.allocator.free(np.concatenate([n.value for n in nodes]))
        for n in reversed(nodes):  # children before parents
            parent = n.parent
            self._remove_leaf(n)
            self._lru.push_if_evictable(parent)
        return sum(n.num_units for n in nodes)

    def _remove_leaf(self, leaf: TreeNode) -> None:
        del leaf.parent.children[leaf.child_key(self.page_size)]
        self._evictable_size -= leaf.num_units
        self._num_nodes -= 1
        leaf.parent = None

    # ------------------------------------------------------------------ export / import
    def export_state(self) -> TreeState:
        """The tree as plain data: nodes parent-first (keys, full slots, parents) and the LRU order
        (`cache.tree_state`). Raises StateError while any node is locked. The tree is unchanged."""
        return export_radix(self)

    def import_state(self, state: TreeState) -> None:
        """Rebuild an exported tree in this empty one (same page size and key mode), taking ownership of
        `state.slots` (allocated in this tree's allocator, owned by nobody else). Afterwards this tree
        behaves as the exported one did (`cache.tree_export`). Raises StateError, changing nothing, on a
        state that is invalid or does not fit."""
        import_radix(self, state)

    # ------------------------------------------------------------------ debugging
    def check_invariants(self, live_reqs=()) -> dict[str, int]:
        """Prove the ownership rule G1/G2 and the accounting A1/A2 (see `cache.radix_invariants`)."""
        return check_radix_invariants(self, live_reqs)

    def pretty(self, max_units: int = 8) -> str:
        """A multi-line drawing of the tree: key units, slots, lock counts."""
        return format_tree(self.root, self.page_size, max_units)

    def __repr__(self) -> str:
        return (
            f"RadixCache(page_size={self.page_size}, eagle={self.eagle}, disabled={self.disabled}, "
            f"nodes={self._num_nodes}, evictable={self._evictable_size}, protected={self._protected_size})"
        )
