"""A finishing or chunked request's insert starts at the request's checked locked path
(`RequestOps._admission_path`) instead of walking from the root. On random interleavings of requests, direct
inserts and matches (which split locked paths between admission and finish) and evictions, both trees on the
production allocators end every step in the same state either way: nodes, slots, locks, LRU order,
accounting, allocator free sets and the requests' slots. A request finished with tokens other than its
admission's falls back to the root walk."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cache import CachedReq, RadixCache, SWARadixCache
from cache.errors import CacheError
from cache.request_ops import RequestOps
from jaxserve.memory import AllocatorFacade, SWAAllocatorFacade, make_allocator, make_swa_allocator

NUM_BASES, MAX_LIVE, POOL_PAGES = 2, 3, 48


def make_tree(kind: str, page_size: int, eagle: bool):
    if kind == "full":
        return RadixCache(
            AllocatorFacade(make_allocator(POOL_PAGES, page_size)), page_size=page_size, eagle=eagle
        )
    alloc = SWAAllocatorFacade(make_swa_allocator(POOL_PAGES, POOL_PAGES, page_size))
    return SWARadixCache(alloc, sliding_window=2 * page_size + 1, page_size=page_size, eagle=eagle)


def snapshot(tree) -> tuple:
    """Everything observable about the tree and its allocator, by token paths (node ids and uuids differ)."""
    nodes, stack = [], [(c, ()) for c in tree.root.children.values()]
    while stack:
        node, path = stack.pop()
        full = path + tuple(node.key.tokens.tolist())
        if isinstance(tree, RadixCache):
            state = (node.lock_ref, node.last_access)
        else:
            state = (node.full_lock_ref, node.swa_lock_ref, node.tombstone, node.swa_uuid is not None)
        nodes.append((full, tuple(node.value.tolist()), state))
        stack.extend((c, full) for c in node.children.values())
    alloc = tree.allocator
    free = (alloc.free_slot_ids().tolist(),)
    if isinstance(tree, RadixCache):
        order = (tree.evictable_size, tree.protected_size)
    else:
        free += (alloc.free_swa_slot_ids().tolist(),)
        lists = (tree.full_lru, tree.swa_lru)
        orders = tuple(tuple(tuple(n.value.tolist()) for n in lru.owners_mru_first()) for lru in lists)
        order = (*orders, tree.full_evictable_size, tree.swa_evictable_size, tree.full_protected_size)
    return sorted(nodes), free, order


class Replay:
    """One op sequence on one tree; `root_walk` forces every request insert to walk from the root."""

    def __init__(self, kind: str, page_size: int, eagle: bool, root_walk: bool) -> None:
        self.tree, self.p, self.e, self.root_walk = (
            make_tree(kind, page_size, eagle),
            page_size,
            int(eagle),
            root_walk,
        )
        rng = np.random.default_rng(7)
        self.bases = [rng.integers(1, 4, 8 * page_size + 2).tolist() for _ in range(NUM_BASES)]
        self.reqs: list[tuple[CachedReq, list[int], int]] = []  # (req, prompt, positions with slots)
        self.misused = False  # a finish with other tokens breaks the ownership rule on both paths alike

    def tokens(self, base: int, length: int, suffix: int) -> list[int]:
        return self.bases[base][:length] + [1 + (length + i) % 3 for i in range(suffix)]

    def room(self, num_slots: int) -> None:
        alloc = self.tree.allocator
        if isinstance(self.tree, RadixCache):
            if (short := num_slots - alloc.available_size()) > 0:
                self.tree.evict(short)
        else:
            full, swa = num_slots - alloc.full_available_size(), num_slots - alloc.swa_available_size()
            if full > 0 or swa > 0:
                self.tree.evict(max(full, 0), max(swa, 0))

    def grow(self, req: CachedReq, stop: int) -> bool:
        """Slots for positions [len(kv_slots), stop), as `KVCache.extend` takes them."""
        start, p = req.kv_slots.shape[0], self.p
        if stop <= start:
            return True
        new_pages = -(-stop // p) - (-(-start // p))
        if new_pages == 0:
            last = int(req.kv_slots[start - 1])
            new = np.arange(last + 1, last + 1 + stop - start, dtype=np.int64)
        else:
            self.room(new_pages * p)
            last_loc = int(req.kv_slots[start - 1]) if start else 0
            new = self.tree.allocator.alloc_extend(np.array([start]), np.array([stop]), np.array([last_loc]))
            if new is None:
                return False
        req.kv_slots = np.concatenate((req.kv_slots, new))
        return True

    def apply(self, op: tuple) -> object:
        kind, *args = op
        tree = self.tree
        if kind == "admit" and len(self.reqs) < MAX_LIVE:
            prompt = self.tokens(*args)
            req = CachedReq(last_node=tree.root)
            start = tree.admit(req, prompt)
            self.reqs.append((req, prompt, start))
            return start, req.kv_slots.tolist()
        if kind == "insert":
            tokens = self.tokens(*args)
            units = max(len(tokens) - self.e, 0)
            units -= units % self.p
            if units == 0:
                return None
            self.room(units)
            slots = tree.allocator.alloc(units)
            if slots is None:
                return None
            cached = tree.insert(tokens[: units + self.e], slots)
            if isinstance(tree, RadixCache) and cached:
                tree.allocator.free(slots[:cached])
            return cached
        if kind == "match":
            return tree.match_prefix(self.tokens(*args)).slots.tolist()
        if kind == "evict":
            return tree.evict(args[0]) if isinstance(tree, RadixCache) else tree.evict(args[0], args[0])
        if not self.reqs:
            return None
        i = args[0] % len(self.reqs)
        req, prompt, done = self.reqs[i]
        if kind == "chunk":
            stop = min(done + args[1], len(prompt))
            if stop <= req.prefix_len or not self.grow(req, stop):
                return None
            self.reqs[i] = (req, prompt, stop)
            return tree.cache_unfinished_req(req, prompt[:stop]), req.kv_slots.tolist()
        if kind in ("finish", "finish_other"):
            if not self.grow(req, len(prompt)):
                return None
            self.reqs.pop(i)
            tokens = [*prompt, 2]
            if kind == "finish_other" and req.last_matched_prefix_len:
                tokens[0] = 4 + tokens[0]  # not the admitted tokens: the path check must fail
                self.misused = True
            tree.cache_finished_req(req, tokens)
            return "finished"
        self.reqs.pop(i)
        tree.release_req(req)
        return "released"


_base = st.integers(0, NUM_BASES - 1)
op = st.one_of(
    st.tuples(st.just("admit"), _base, st.integers(0, 20), st.integers(1, 6)),
    st.tuples(st.just("admit"), _base, st.integers(0, 20), st.integers(1, 6)),
    st.tuples(st.just("insert"), _base, st.integers(0, 20), st.integers(0, 4)),
    st.tuples(st.just("match"), _base, st.integers(0, 20), st.integers(0, 3)),
    st.tuples(st.just("evict"), st.integers(1, 12)),
    st.tuples(st.just("chunk"), st.integers(0, MAX_LIVE - 1), st.integers(1, 7)),
    st.tuples(st.just("finish"), st.integers(0, MAX_LIVE - 1)),
    st.tuples(st.just("finish"), st.integers(0, MAX_LIVE - 1)),
    st.tuples(st.just("finish_other"), st.integers(0, MAX_LIVE - 1)),
    st.tuples(st.just("release"), st.integers(0, MAX_LIVE - 1)),
)


# a request admitted on a cached path finishes after another insert made something else more recent
_REFRESH = [("insert", 0, 12, 0), ("admit", 0, 12, 2), ("insert", 1, 12, 0), ("finish", 0)]


@pytest.mark.parametrize("kind", ["full", "swa"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(page_size=st.sampled_from([1, 2, 4]), eagle=st.booleans(), ops=st.lists(op, max_size=40))
@example(page_size=4, eagle=False, ops=_REFRESH)
@example(page_size=1, eagle=True, ops=[*_REFRESH[:2], ("match", 0, 3, 0), ("chunk", 0, 2), *_REFRESH[2:]])
@example(page_size=1, eagle=False,  # a misused finish double-owns a slot; both paths raise alike on evict
         ops=[("admit", 0, 0, 1), ("chunk", 0, 1), ("finish_other", 0), ("evict", 1), ("evict", 1)])
def test_insert_from_the_locked_path_equals_the_root_walk(
    kind: str, page_size: int, eagle: bool, ops
) -> None:
    fast = Replay(kind, page_size, eagle, root_walk=False)
    slow = Replay(kind, page_size, eagle, root_walk=True)
    for o in ops:
        got, want = outcome(fast.apply, o), outcome(lambda o: run_walking_from_root(slow, o), o)
        assert got == want
        if isinstance(got, tuple) and got[:1] == ("raised",):
            break  # a misused finish can leave the tree double-owning a slot: both paths then fail alike
        assert snapshot(fast.tree) == snapshot(slow.tree)
        assert [r.kv_slots.tolist() for r, _, _ in fast.reqs] == [
            r.kv_slots.tolist() for r, _, _ in slow.reqs
        ]
    if not fast.misused:
        fast.tree.check_invariants([r for r, _, _ in fast.reqs])


def outcome(apply, o: tuple) -> object:
    """`apply(o)`'s result, or ("raised", exception type name, message) for an error of the cache API."""
    try:
        return apply(o)
    except (CacheError, ValueError) as exc:
        return ("raised", type(exc).__name__, str(exc))


def run_walking_from_root(replay: Replay, o: tuple) -> object:
    """`replay.apply(o)` with `_admission_path` answering None: every request insert walks from the root."""
    tree = replay.tree
    tree._admission_path = lambda req, token_bytes: None
    try:
        return replay.apply(o)
    finally:
        del tree._admission_path


def test_the_path_check_rejects_other_tokens_and_dead_nodes() -> None:
    tree = make_tree("full", 1, False)
    req = CachedReq(last_node=tree.root)
    tree.insert([1, 2, 3, 4], tree.allocator.alloc(4))
    assert tree.admit(req, [1, 2, 3, 4, 5]) == 4
    key_bytes = np.array([1, 2, 3, 4, 5], np.int64).tobytes()
    assert RequestOps._admission_path(tree, req, key_bytes) == [req.last_node]
    assert RequestOps._admission_path(tree, req, np.array([1, 2, 9, 4], np.int64).tobytes()) is None
    tree.match_prefix([1, 2, 7])  # splits the locked node: the path grows, the check still holds
    assert len(RequestOps._admission_path(tree, req, key_bytes)) == 2
    tree.release_req(req)
    fresh = CachedReq(last_node=tree.root)
    assert RequestOps._admission_path(tree, fresh, key_bytes) == []
