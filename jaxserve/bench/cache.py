"""Prefix-cache benchmark on a shared-prefix workload (many requests reusing a few long system prompts).

    python -m jaxserve.bench.cache                 # 2,000 requests, all rows (several minutes on one core)
    python -m jaxserve.bench.cache --requests 200  # quick run
    python -m jaxserve.bench.cache --tree-only     # time only match_prefix + insert per request
    python -m jaxserve.bench.cache --repeats 1     # one pass per row and side (default: best of 3)

Workload: N requests of 200-2,000 tokens, each a random 10-100% prefix of one of 50 random 2,000-token
"system prompts" plus a random suffix; pools of 2^19 slots (full and SWA), W = 512 for the SWA tree.

Timed per request (the whole request path, default): admission (match the prompt but its last token, lock
the match), the slots for the rest of the prompt (evicting first when the pool is short), and the finish
with one sampled token (insert the page-floored KV prefix, free the duplicates and the tail, unlock). Ours
runs `cache.RadixCache` / `SWARadixCache` over the production `AllocatorFacade` / `SWAAllocatorFacade`,
built as `KVCache` builds them. `--tree-only` times just one `match_prefix(tokens)` and one `insert` per
request, with allocation, frees and evictions outside the timed region.

Every ratio is measured in the same run, on the same requests, each side's best of `--repeats` passes, the
passes of the two sides alternating (on a shared machine the load moves between passes):
- `x sgl`: against `SGLangStyleTree` / `SGLangStyleSWATree` below, our model of SGLang 0.5.3.post1's
  algorithm: per-node Python lists as keys (bigram keys as lists of tuples), Python loops comparing keys,
  every leaf collected on each eviction, LRU lists with dict membership for the SWA tree, and allocators
  whose free list is an array copied whole on every free (SGLang's `torch.cat`). It skips SGLang's
  per-call overheads that do not belong to the algorithm (RadixKey objects, torch dispatch, events), so it
  is if anything faster than the real classes.
- `x real`: against SGLang 0.5.3.post1's own `RadixCache` / `SWARadixCache`, token allocators and
  request-to-token pool, run from its sources (`sglang_reference`; `scripts/setup.sh` installs them,
  `--sglang-sources` points elsewhere), on the whole request path at page size 1 (its paged allocator
  needs a GPU). `matched` equal to ours says both trees reused the same prefixes.
- `x naive`: against a trie with one dict per token (no eviction, no allocator), match + insert only.
"""

from __future__ import annotations

import argparse
import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import count, pairwise
from pathlib import Path

import numpy as np

from cache import CachedReq, RadixCache
from jaxserve.bench import sglang_reference
from jaxserve.memory import (
    AllocatorFacade,
    SWAAllocatorFacade,
    evict_shortfall,
    make_allocator,
    make_swa_allocator,
)

POOL_SLOTS = 2**19
SLIDING_WINDOW = 512
# CPU time of this process: on a shared machine wall time also counts other processes' turns. On an idle
# machine the two agree (one thread); `--wall-clock` switches.
CLOCK = time.process_time


def make_workload(num_requests: int, seed: int = 0, num_prompts: int = 50, prompt_tokens: int = 2000,
                  vocab: int = 32000) -> list[np.ndarray]:  # fmt: skip
    """The requests' token ids (int64 arrays), deterministic in `seed`."""
    rng = np.random.default_rng(seed)
    prompts = rng.integers(0, vocab, (num_prompts, prompt_tokens), dtype=np.int64)
    requests = []
    for _ in range(num_requests):
        num_tokens = int(rng.integers(200, 2001))
        shared = min(int(rng.uniform(0.1, 1.0) * prompt_tokens), num_tokens)
        suffix = rng.integers(0, vocab, num_tokens - shared, dtype=np.int64)
        requests.append(np.concatenate([prompts[rng.integers(num_prompts)][:shared], suffix]))
    return requests


def insert_units(num_tokens: int, page_size: int, eagle: bool) -> int:
    """Units (= slots) an insert of `num_tokens` tokens with KV stores: page-floored, one less under EAGLE."""
    units = max(num_tokens - eagle, 0)
    return units - units % page_size


@dataclass
class RowResult:
    """Seconds spent, and the slots reused from the tree, over one pass of the workload."""

    seconds: float
    matched_slots: int
    num_requests: int

    @property
    def ops(self) -> float:
        """Requests per second."""
        return self.num_requests / self.seconds


# ---------------------------------------------------------------------------------------------- ours
def make_tree(kind: str, page_size: int, eagle: bool):
    """Our tree of `kind` ('full' or 'swa') over the production allocator facade, as `KVCache` builds it."""
    num_pages = POOL_SLOTS // page_size
    if kind == "full":
        alloc = AllocatorFacade(make_allocator(num_pages, page_size))
        return RadixCache(alloc, page_size=page_size, eagle=eagle)
    from cache import SWARadixCache

    alloc = SWAAllocatorFacade(make_swa_allocator(num_pages, num_pages, page_size))
    return SWARadixCache(alloc, sliding_window=SLIDING_WINDOW, page_size=page_size, eagle=eagle)


def _make_room(tree, num_slots: int) -> None:
    """Evict what the allocator is short of `num_slots`, as `KVCache` does before it allocates."""
    alloc = tree.allocator
    evict_shortfall(tree, alloc, num_slots, hybrid=isinstance(alloc, SWAAllocatorFacade))


def run_ours_request(tree, prompt: np.ndarray, tokens: np.ndarray) -> int:
    """One request on our tree: admit `prompt`, give it slots for the rest of the prompt as `KVCache.extend`
    does (evict what is short, then one `alloc_extend`), finish with `tokens` (prompt + one sampled token).
    Returns the slots reused from the tree."""
    req = CachedReq(last_node=tree.root)
    start = tree.admit(req, prompt)
    stop, page_size = prompt.shape[0], tree.page_size
    _make_room(tree, -(-stop // page_size) * page_size - start)
    last_loc = req.kv_slots[start - 1 : start] if start else np.zeros(1, np.int64)
    new = tree.allocator.alloc_extend(np.array([start]), np.array([stop]), last_loc)
    req.kv_slots = np.concatenate((req.kv_slots, new))
    tree.cache_finished_req(req, tokens)
    return start


def run_ours(kind: str, page_size: int, eagle: bool, requests: list[np.ndarray]) -> RowResult:
    """The whole request path on our tree, every request in turn."""
    tree = make_tree(kind, page_size, eagle)
    finished = [np.append(t, 0) for t in requests]  # prompt + one sampled token (its KV is never computed)
    matched, clock = 0, CLOCK
    t0 = clock()
    for prompt, tokens in zip(requests, finished, strict=True):
        matched += run_ours_request(tree, prompt, tokens)
    return RowResult(clock() - t0, matched, len(requests))


def run_ours_tree_only(kind: str, page_size: int, eagle: bool, requests: list[np.ndarray]) -> RowResult:
    """Only `match_prefix(tokens)` and `insert` are timed; allocation, frees and evictions are not."""
    tree = make_tree(kind, page_size, eagle)
    alloc, seconds, matched, clock = tree.allocator, 0.0, 0, CLOCK
    for tokens in requests:
        t0 = clock()
        slots, _ = tree.match_prefix(tokens)
        seconds += clock() - t0
        matched += slots.shape[0]
        units = insert_units(tokens.shape[0], page_size, eagle)
        if units == 0:
            continue
        _make_room(tree, units)
        new_slots = alloc.alloc(units)
        t0 = clock()
        num_cached = tree.insert(tokens[: units + eagle], new_slots)
        seconds += clock() - t0
        if kind == "full" and num_cached:
            alloc.free(new_slots[:num_cached])  # the caller's duplicates (the SWA tree frees its own)
    return RowResult(seconds, matched, len(requests))


# ------------------------------------------------------------------- SGLang-style baseline: allocators
class SGLangStyleAllocator:
    """SGLang's token / paged allocator: a free-page array; alloc takes its head, free copies it whole.

    Page size 1 appends freed slots at the end (FIFO reuse); paged prepends the freed pages (LIFO)."""

    def __init__(self, num_slots: int, page_size: int) -> None:
        self.page_size = page_size
        self.free_pages = np.arange(1, num_slots // page_size + 1, dtype=np.int64)

    def available_size(self) -> int:
        return self.free_pages.shape[0] * self.page_size

    def alloc(self, num_slots: int) -> np.ndarray | None:
        p = self.page_size
        num_pages = -(-num_slots // p)
        if num_pages > self.free_pages.shape[0]:
            return None
        pages, self.free_pages = self.free_pages[:num_pages], self.free_pages[num_pages:]
        if p == 1:
            return pages
        return (pages[:, None] * p + np.arange(p)).reshape(-1)[:num_slots]

    def free(self, slots: np.ndarray) -> None:
        if slots.shape[0] == 0:
            return
        if self.page_size == 1:
            self.free_pages = np.concatenate((self.free_pages, slots))
        else:
            self.free_pages = np.concatenate((np.unique(slots // self.page_size), self.free_pages))


class SGLangStyleSWAAllocator:
    """SGLang 0.5.3.post1's hybrid allocator (token-granular on both sides) with a full->SWA slot mapping."""

    def __init__(self, num_slots: int) -> None:
        self.full = SGLangStyleAllocator(num_slots, 1)
        self.swa = SGLangStyleAllocator(num_slots, 1)
        self.mapping = np.zeros(num_slots + 1, dtype=np.int64)

    def available_size(self) -> int:
        return min(self.full.available_size(), self.swa.available_size())

    def alloc(self, num_slots: int) -> np.ndarray | None:
        if num_slots > self.available_size():
            return None
        full = self.full.alloc(num_slots)
        self.mapping[full] = self.swa.alloc(num_slots)
        return full

    def free(self, slots: np.ndarray) -> None:
        if slots.shape[0]:
            self.full.free(slots)
            self.free_swa(slots)

    def free_swa(self, slots: np.ndarray) -> None:
        swa = self.mapping[slots]
        self.swa.free(swa[swa > 0])
        self.mapping[slots] = 0


# ------------------------------------------------------------------------- SGLang-style baseline: trees
def _key_list(tokens: list, eagle: bool) -> list:
    return list(pairwise(tokens)) if eagle else tokens  # SGLang builds this list of tuples on every call


def _match_len(key0: list, key1: list, page_size: int) -> int:
    if page_size == 1:
        i = 0
        for k0, k1 in zip(key0, key1, strict=False):
            if k0 != k1:
                break
            i += 1
        return i
    i, n = 0, min(len(key0), len(key1))
    while i < n and key0[i : i + page_size] == key1[i : i + page_size]:
        i += page_size
    return i


def _child_key(key: list, page_size: int):
    return key[0] if page_size == 1 else tuple(key[:page_size])


class _Node:
    __slots__ = ("children", "key", "last_access_time", "lock_ref", "parent", "value")

    def __init__(self) -> None:
        self.children: dict = {}
        self.parent: _Node | None = None
        self.key: list = []
        self.value = np.zeros(0, np.int64)
        self.lock_ref = 0
        self.last_access_time = time.monotonic()

    def __lt__(self, other: _Node) -> bool:
        return self.last_access_time < other.last_access_time


class SGLangStyleTree:
    """SGLang 0.5.3.post1's `RadixCache` algorithm (list keys, Python compares, leaf scan per eviction),
    with its request path (admission match and lock, finish insert, duplicate and tail frees)."""

    def __init__(self, page_size: int, eagle: bool) -> None:
        self.page_size, self.eagle = page_size, eagle
        self.allocator = SGLangStyleAllocator(POOL_SLOTS, page_size)
        self.root = _Node()
        self.root.lock_ref = 1

    def match_prefix(self, key: list) -> tuple[np.ndarray, _Node]:
        p = self.page_size
        key = key[: len(key) // p * p]
        if not key:
            return np.zeros(0, np.int64), self.root
        node = self.root
        node.last_access_time = time.monotonic()
        values = []
        while key and (child := node.children.get(_child_key(key, p))) is not None:
            child.last_access_time = time.monotonic()
            m = _match_len(child.key, key, p)
            if m < len(child.key):
                node = self._split(child, m)
                values.append(node.value)
                break
            values.append(child.value)
            node, key = child, key[m:]
        return (np.concatenate(values) if values else np.zeros(0, np.int64)), node

    def insert(self, key: list, value: np.ndarray) -> int:
        p, node, total = self.page_size, self.root, 0
        node.last_access_time = time.monotonic()
        while key and (child := node.children.get(_child_key(key, p))) is not None:
            node = child
            node.last_access_time = time.monotonic()
            m = _match_len(node.key, key, p)
            total += m
            key, value = key[m:], value[m:]
            if m < len(node.key):
                node = self._split(node, m)
        if key:
            leaf = _Node()
            leaf.parent, leaf.key, leaf.value = node, key, value
            node.children[_child_key(key, p)] = leaf
        return total

    def _split(self, child: _Node, m: int) -> _Node:
        p, new = self.page_size, _Node()
        new.children = {_child_key(child.key[m:], p): child}
        new.parent, new.lock_ref = child.parent, child.lock_ref
        new.key, new.value = child.key[:m], child.value[:m]
        child.parent, child.key, child.value = new, child.key[m:], child.value[m:]
        new.parent.children[_child_key(new.key, p)] = new
        return new

    def inc_lock_ref(self, node: _Node) -> None:
        while node is not self.root:
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: _Node) -> None:
        while node is not self.root:
            node.lock_ref -= 1
            node = node.parent

    def evict(self, num_tokens: int) -> None:
        leaves, stack = [], [self.root]
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            else:
                leaves.append(node)
        heapq.heapify(leaves)
        evicted = 0
        while evicted < num_tokens and leaves:
            x = heapq.heappop(leaves)
            if x is self.root:
                break
            if x.lock_ref > 0:
                continue
            self.allocator.free(x.value)
            evicted += len(x.value)
            parent = x.parent
            del parent.children[_child_key(x.key, self.page_size)]
            if not parent.children:
                heapq.heappush(leaves, parent)

    def run_request(self, tokens: list) -> int:
        """Admit, allocate the prompt's rest, finish with one sampled token; returns the slots reused."""
        eagle, p = self.eagle, self.page_size
        prefix, node = self.match_prefix(_key_list(tokens[:-1], eagle))
        self.inc_lock_ref(node)
        need = len(tokens) - len(prefix)
        reserve = need if p == 1 else need + p  # the paged path over-estimates by a page per request
        if self.allocator.available_size() < reserve:
            self.evict(reserve)
        kv = np.concatenate((prefix, self.allocator.alloc(need)))
        actual = len(tokens) - eagle  # R1: under EAGLE the last token's KV stays out
        aligned = actual // p * p
        self.allocator.free(kv[aligned:])
        new_prefix = self.insert(_key_list(tokens[: aligned + eagle], eagle), kv[:aligned])
        self.allocator.free(kv[len(prefix) : new_prefix])
        self.dec_lock_ref(node)
        return len(prefix)


class _LRU:
    """SGLang's doubly linked LRU list: sentinels, a dict for membership, link names chosen per list."""

    def __init__(self, swa: bool) -> None:
        self.prv, self.nxt = ("swa_prev", "swa_next") if swa else ("prev", "next")
        self.lock = "swa_lock_ref" if swa else "full_lock_ref"
        self.head, self.tail = _SWANode(), _SWANode()
        setattr(self.head, self.nxt, self.tail)
        setattr(self.tail, self.prv, self.head)
        self.cache: dict[int, _SWANode] = {}

    def _add_after(self, anchor: _SWANode, node: _SWANode) -> None:
        after = getattr(anchor, self.nxt)
        setattr(node, self.prv, anchor)
        setattr(node, self.nxt, after)
        setattr(after, self.prv, node)
        setattr(anchor, self.nxt, node)

    def insert_mru(self, node: _SWANode) -> None:
        self.cache[node.id] = node
        self._add_after(self.head, node)

    def remove(self, node: _SWANode) -> None:
        del self.cache[node.id]
        prv, nxt = getattr(node, self.prv), getattr(node, self.nxt)
        setattr(prv, self.nxt, nxt)
        setattr(nxt, self.prv, prv)

    def reset_node_and_parents_mru(self, node: _SWANode, root: _SWANode) -> None:
        prev = self.head
        while node is not root:
            if node.id in self.cache:  # the SWA list skips tombstones
                self.remove(node)
                self.cache[node.id] = node
                self._add_after(prev, node)
                prev = node
            node = node.parent

    def lru_no_lock(self, start: _SWANode | None = None, leaf: bool = False) -> _SWANode | None:
        x = getattr(self.tail if start is None else start, self.prv)
        while x is not self.head:
            if getattr(x, self.lock) == 0 and (not leaf or not x.children):
                return x
            x = getattr(x, self.prv)
        return None


_ids = count()


class _SWANode:
    __slots__ = ("children", "full_lock_ref", "id", "key", "next", "parent", "prev", "swa_lock_ref",
                 "swa_next", "swa_prev", "swa_uuid", "tombstone", "value")  # fmt: skip

    def __init__(self) -> None:
        self.children: dict = {}
        self.parent: _SWANode | None = None
        self.key: list = []
        self.value = np.zeros(0, np.int64)
        self.full_lock_ref = self.swa_lock_ref = 0
        self.tombstone, self.swa_uuid, self.id = False, None, next(_ids)
        self.prev = self.next = self.swa_prev = self.swa_next = None


class SGLangStyleSWATree:
    """SGLang 0.5.3.post1's `SWARadixCache` algorithm (full and SWA LRU lists, tombstones, the window rule),
    with its request path."""

    def __init__(self, page_size: int, eagle: bool) -> None:
        self.page_size, self.eagle, self.window = page_size, eagle, SLIDING_WINDOW
        self.allocator = SGLangStyleSWAAllocator(POOL_SLOTS)
        self.root = _SWANode()
        self.root.full_lock_ref = self.root.swa_lock_ref = 1
        self.full_lru, self.swa_lru = _LRU(False), _LRU(True)
        self.uuids = count(1)

    def match_prefix(self, key: list) -> tuple[np.ndarray, _SWANode]:
        p = self.page_size
        key = key[: len(key) // p * p]
        if not key:
            return np.zeros(0, np.int64), self.root
        node, values, since = self.root, [], float("inf")
        best_len, best_node = 0, self.root
        while key and (child := node.children.get(_child_key(key, p))) is not None:
            if child.tombstone and since >= self.window:
                best_len, best_node, since = len(values), node, 0
            m = _match_len(child.key, key, p)
            if m < len(child.key):
                node = self._split(child, m)
                values.append(node.value)
                if not node.tombstone:
                    since += m
                break
            values.append(child.value)
            if not child.tombstone:
                since += len(child.value)
            node, key = child, key[m:]
        if since >= self.window:
            best_len, best_node = len(values), node
        self.full_lru.reset_node_and_parents_mru(best_node, self.root)
        self.swa_lru.reset_node_and_parents_mru(best_node, self.root)
        return (np.concatenate(values[:best_len]) if best_len else np.zeros(0, np.int64)), best_node

    def insert(self, key: list, value: np.ndarray, prev_prefix_len: int) -> int:
        p, node, total = self.page_size, self.root, 0
        while key and (child := node.children.get(_child_key(key, p))) is not None:
            node = child
            self._touch(node)
            m = _match_len(node.key, key, p)
            if m < len(node.key):
                node = self._split(node, m)
            if prev_prefix_len < total + m:
                first = max(0, prev_prefix_len - total)
                if node.tombstone:
                    self.allocator.free(node.value[first:])
                    node.value, node.tombstone = value[:m].copy(), False
                    self.swa_lru.insert_mru(node)
                else:
                    self.allocator.free(value[first:m])
            total += m
            key, value = key[m:], value[m:]
        if key:
            leaf = _SWANode()
            leaf.parent, leaf.key, leaf.value = node, key, value.copy()
            node.children[_child_key(key, p)] = leaf
            self.full_lru.insert_mru(leaf)
            self.swa_lru.insert_mru(leaf)
        return total

    def _touch(self, node: _SWANode) -> None:
        self.full_lru.remove(node)
        self.full_lru.insert_mru(node)
        if not node.tombstone:
            self.swa_lru.remove(node)
            self.swa_lru.insert_mru(node)

    def _split(self, child: _SWANode, m: int) -> _SWANode:
        p, new = self.page_size, _SWANode()
        self.full_lru.remove(child)
        if not child.tombstone:
            self.swa_lru.remove(child)
        new.children = {_child_key(child.key[m:], p): child}
        new.parent, new.tombstone = child.parent, child.tombstone
        new.full_lock_ref, new.swa_lock_ref = child.full_lock_ref, child.swa_lock_ref
        new.swa_uuid, child.swa_uuid = child.swa_uuid, None
        new.key, new.value = child.key[:m], child.value[:m]
        child.parent, child.key, child.value = new, child.key[m:], child.value[m:]
        new.parent.children[_child_key(new.key, p)] = new
        self.full_lru.insert_mru(new)
        self.full_lru.insert_mru(child)
        if not child.tombstone:
            self.swa_lru.insert_mru(new)
            self.swa_lru.insert_mru(child)
        return new

    def inc_lock_ref(self, node: _SWANode) -> int | None:
        swa_locked, uuid = 0, None
        while node is not self.root:
            node.full_lock_ref += 1
            if swa_locked < self.window:
                node.swa_lock_ref += 1
                swa_locked += len(node.value)
                if swa_locked >= self.window:
                    if node.swa_uuid is None:
                        node.swa_uuid = next(self.uuids)
                    uuid = node.swa_uuid
            node = node.parent
        return uuid

    def dec_lock_ref(self, node: _SWANode, uuid: int | None) -> None:
        dec_swa = True
        while node is not self.root:
            node.full_lock_ref -= 1
            if dec_swa:
                node.swa_lock_ref -= 1
                if uuid is not None and node.swa_uuid == uuid:
                    dec_swa = False
            node = node.parent

    def _delete_leaf(self, x: _SWANode) -> _SWANode:
        """Free and unlink an unlocked leaf, then its childless tombstone parents; returns the survivor."""
        self.allocator.free(x.value)
        self.full_lru.remove(x)
        self.swa_lru.remove(x)
        parent = x.parent
        del parent.children[_child_key(x.key, self.page_size)]
        root = self.root
        while parent is not root and parent.tombstone and not parent.children and not parent.full_lock_ref:
            self.allocator.free(parent.value)
            self.full_lru.remove(parent)
            grand = parent.parent
            del grand.children[_child_key(parent.key, self.page_size)]
            parent = grand
        return parent

    def evict(self, full_num_tokens: int, swa_num_tokens: int) -> None:
        full_evicted = swa_evicted = 0
        x = self.full_lru.lru_no_lock(leaf=True) if full_num_tokens > 0 else None
        while full_evicted < full_num_tokens and x is not None:
            full_evicted += len(x.value)
            swa_evicted += len(x.value)
            nxt = self.full_lru.lru_no_lock(x, leaf=True)
            if not self._delete_leaf(x).children:
                nxt = self.full_lru.lru_no_lock(leaf=True)
            x = nxt
        x = self.swa_lru.lru_no_lock() if swa_evicted < swa_num_tokens else None
        while swa_evicted < swa_num_tokens and x is not None:
            swa_evicted += len(x.value)
            nxt = self.swa_lru.lru_no_lock(x)
            if x.children:
                self.allocator.free_swa(x.value)
                self.swa_lru.remove(x)
                x.tombstone = True
            else:
                self._delete_leaf(x)
            x = nxt

    def run_request(self, tokens: list) -> int:
        """Admit, allocate the prompt's rest, finish with one sampled token; returns the slots reused."""
        eagle, p = self.eagle, self.page_size
        prefix, node = self.match_prefix(_key_list(tokens[:-1], eagle))
        uuid = self.inc_lock_ref(node)
        need = len(tokens) - len(prefix)
        if self.allocator.available_size() < need:
            full_short = need - self.allocator.full.available_size()
            swa_short = need - self.allocator.swa.available_size()
            self.evict(max(0, full_short), max(0, swa_short))
        kv = np.concatenate((prefix, self.allocator.alloc(need)))
        actual = len(tokens) - eagle
        aligned = actual // p * p
        self.allocator.free(kv[aligned:])
        self.insert(_key_list(tokens[: aligned + eagle], eagle), kv[:aligned], len(prefix))
        self.dec_lock_ref(node, uuid)
        return len(prefix)


def run_sglang_style(kind: str, page_size: int, eagle: bool, requests: list[np.ndarray]) -> RowResult:
    """The whole request path on the SGLang-style baseline (token lists are its native input)."""
    tree = (SGLangStyleTree if kind == "full" else SGLangStyleSWATree)(page_size, eagle)
    lists = [t.tolist() for t in requests]
    matched, clock = 0, CLOCK
    t0 = clock()
    for tokens in lists:
        matched += tree.run_request(tokens)
    return RowResult(clock() - t0, matched, len(requests))


def run_sglang_style_tree_only(
    kind: str, page_size: int, eagle: bool, requests: list[np.ndarray]
) -> RowResult:
    """Only the baseline's `match_prefix` and `insert` (with the bigram conversion) are timed."""
    tree = (SGLangStyleTree if kind == "full" else SGLangStyleSWATree)(page_size, eagle)
    alloc, seconds, matched, clock = tree.allocator, 0.0, 0, CLOCK
    for tokens in (t.tolist() for t in requests):
        t0 = clock()
        slots, _ = tree.match_prefix(_key_list(tokens, eagle))
        seconds += clock() - t0
        matched += slots.shape[0]
        units = insert_units(len(tokens), page_size, eagle)
        if units == 0:
            continue
        if alloc.available_size() < units:
            if kind == "full":
                tree.evict(units)
            else:
                tree.evict(units, units)
        new_slots = alloc.alloc(units)
        t0 = clock()
        if kind == "full":
            num_cached = tree.insert(_key_list(tokens[: units + eagle], eagle), new_slots)
        else:
            tree.insert(_key_list(tokens[: units + eagle], eagle), new_slots, 0)
        seconds += clock() - t0
        if kind == "full" and num_cached:
            alloc.free(new_slots[:num_cached])
    return RowResult(seconds, matched, len(requests))


# ------------------------------------------------------------------------------- naive per-token trie
class NaiveTrie:
    """One dict per unit, a Python loop over units. Node = [children dict, slot]."""

    def __init__(self, page_size: int, eagle: bool) -> None:
        self.page_size, self.eagle = page_size, eagle
        self.root: dict = {}
        self.next_slot = 1

    def _units(self, tokens: np.ndarray) -> list:
        ids = tokens.tolist()
        units = list(pairwise(ids)) if self.eagle else ids
        return units[: len(units) - len(units) % self.page_size]

    def match(self, tokens: np.ndarray) -> list[int]:
        node, out = self.root, []
        for unit in self._units(tokens):
            entry = node.get(unit)
            if entry is None:
                break
            out.append(entry[1])
            node = entry[0]
        return out[: len(out) - len(out) % self.page_size]

    def insert(self, tokens: np.ndarray) -> int:
        node, num_cached = self.root, 0
        for unit in self._units(tokens):
            entry = node.get(unit)
            if entry is None:
                entry = node[unit] = [{}, self.next_slot]
                self.next_slot += 1
            else:
                num_cached += 1
            node = entry[0]
        return num_cached


def run_naive(page_size: int, eagle: bool, requests: list[np.ndarray]) -> RowResult:
    """One match and one insert per request on the naive trie (nothing evicted, nothing allocated)."""
    trie, matched, clock = NaiveTrie(page_size, eagle), 0, CLOCK
    t0 = clock()
    for tokens in requests:
        matched += len(trie.match(tokens[:-1]))
        trie.insert(tokens)
    return RowResult(clock() - t0, matched, len(requests))


def best_of(best: RowResult | None, result: RowResult) -> RowResult:
    """The faster of two passes over the same workload (`best` None: `result`)."""
    return result if best is None or result.seconds < best.seconds else best


# ------------------------------------------------------------------------------------------ scaling
def time_per_call(fn: Callable[[], object], repeats: int) -> float:
    t0 = CLOCK()
    for _ in range(repeats):
        fn()
    return (CLOCK() - t0) / repeats


def scaling_rows(repeats: int = 2000) -> list[str]:
    """Match cost of cached prompts: 64 vs 4,096 tokens in one node each (cost should barely move), and
    4,096 tokens split over 64 nodes (cost grows with nodes visited); the naive trie for contrast."""
    rng = np.random.default_rng(1)
    tree, trie = make_tree("full", 1, False), NaiveTrie(1, False)
    alloc = tree.allocator
    short, long = rng.integers(0, 32000, 64), rng.integers(32000, 64000, 4096)
    split = rng.integers(64000, 96000, 4096)
    for prompt in (short, long, split):
        tree.insert(prompt, alloc.alloc(prompt.shape[0]))
        trie.insert(prompt)
    for end in range(64, 4096, 64):  # a branch every 64 tokens cuts `split` into 64 nodes
        branch = np.concatenate([split[:end], [7]])
        if num_cached := tree.insert(branch, slots := alloc.alloc(end + 1)):
            alloc.free(slots[:num_cached])
    ours = [time_per_call(lambda p=p: tree.match_prefix(p), repeats) for p in (short, long, split)]
    naive = [time_per_call(lambda p=p: trie.match(p), max(repeats // 10, 1)) for p in (short, long)]
    return [
        f"match of a cached prompt: 64 tokens / 1 node {ours[0] * 1e6:.1f} us, 4,096 tokens / 1 node "
        f"{ours[1] * 1e6:.1f} us (x{ours[1] / ours[0]:.2f}), 4,096 tokens / 64 nodes {ours[2] * 1e6:.1f} us "
        f"(x{ours[2] / ours[0]:.1f})",
        f"naive trie: 64 tokens {naive[0] * 1e6:.1f} us, 4,096 tokens {naive[1] * 1e6:.1f} us "
        f"(x{naive[1] / naive[0]:.1f})",
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="number of requests (default 2000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trees", default="full,swa", help="comma-separated subset of full,swa")
    parser.add_argument("--page-sizes", default="1,16", help="comma-separated page sizes")
    parser.add_argument("--tree-only", action="store_true", help="time only match_prefix + insert")
    parser.add_argument("--wall-clock", action="store_true", help="time with perf_counter, not CPU time")
    parser.add_argument("--repeats", type=int, default=3, help="passes per row and side; the best is kept")
    parser.add_argument("--sglang-sources", type=Path, default=sglang_reference.default_sources(),
                        help="directory holding SGLang 0.5.3.post1's `sglang` package: its own caches are "
                             "run too, page size 1, whole request path (default: where scripts/setup.sh "
                             "installs them)")
    args = parser.parse_args(argv)
    global CLOCK
    CLOCK = time.perf_counter if args.wall_clock else time.process_time
    requests = make_workload(args.requests, args.seed)
    timed = "match_prefix + insert only" if args.tree_only else "whole request path"
    print(f"workload: {len(requests)} requests, {sum(t.shape[0] for t in requests):,} tokens, "
          f"pool {POOL_SLOTS} slots, W={SLIDING_WINDOW}, clock={CLOCK.__name__}, timed: {timed}")  # fmt: skip
    ref = None
    if not args.tree_only:
        try:
            ref = sglang_reference.load(args.sglang_sources)
        except (FileNotFoundError, ValueError, ImportError) as exc:
            print(f"SGLang's own caches: not run ({exc})")
    header = (
        f"{'tree':4} {'P':>3} {'EAGLE':5} | {'ours ops/s':>10} {'us/req':>7} {'matched':>10} | "
        f"{'sgl ops/s':>9} {'matched':>10} {'x sgl':>6} | {'real ops/s':>10} {'matched':>10} {'x real':>6} | "
        f"{'naive ops/s':>11} {'x naive':>7}"
    )
    print(header + "\n" + "-" * len(header))
    ours_fn, sgl_fn = (run_ours_tree_only, run_sglang_style_tree_only) if args.tree_only else (
        run_ours, run_sglang_style)  # fmt: skip
    naive: dict[tuple[int, bool], RowResult] = {}
    for kind in args.trees.split(","):
        for page_size in (int(p) for p in args.page_sizes.split(",")):
            for eagle in (False, True):
                ours = sgl = real = None
                for _ in range(args.repeats):  # alternate the sides, so all see the same machine load
                    ours = best_of(ours, ours_fn(kind, page_size, eagle, requests))
                    sgl = best_of(sgl, sgl_fn(kind, page_size, eagle, requests))
                    if ref is not None and page_size == 1:
                        seconds, matched = sglang_reference.run(
                            ref, kind, eagle, requests, num_slots=POOL_SLOTS, sliding_window=SLIDING_WINDOW,
                            clock=CLOCK)
                        real = best_of(real, RowResult(seconds, matched, len(requests)))
                if (page_size, eagle) not in naive:
                    naive[page_size, eagle] = run_naive(page_size, eagle, requests)
                base = naive[page_size, eagle]
                versus_real = (f"{real.ops:10.1f} {real.matched_slots:10,d} {ours.ops / real.ops:6.1f}"
                               if real is not None else f"{'-':>10} {'-':>10} {'-':>6}")
                print(f"{kind:4} {page_size:3d} {eagle!s:5} | {ours.ops:10.1f} {1e6 / ours.ops:7.1f} "
                      f"{ours.matched_slots:10,d} | {sgl.ops:9.1f} {sgl.matched_slots:10,d} "
                      f"{ours.ops / sgl.ops:6.1f} | {versus_real} | {base.ops:11.1f} "
                      f"{ours.ops / base.ops:7.1f}")  # fmt: skip
    print(*scaling_rows(), sep="\n")


if __name__ == "__main__":
    main()
