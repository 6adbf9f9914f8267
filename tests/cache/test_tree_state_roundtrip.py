"""`export_state()` -> `import_state()` on both trees: after random histories (inserts, matches, locks
taken and released, full evictions, SWA evictions that tombstone), a fresh tree that imports the state
behaves exactly as the original from then on. The original tree is the reference: both run the same random
continuation (its matches, inserts and evictions must answer the same and free the same slots), then both
are evicted one unit at a time and must free the same slots step by step (SWA: first tombstoning, then
full eviction). `check_invariants` proves ownership on each after import and after every step. A second
path imports into a fresh allocator through `allocate_state_slots` (a restarted process) and must behave
the same up to the renaming of slots. Bad states and locked trees are refused without changes."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cache import RadixCache, StateError, SWARadixCache, TreeState, allocate_state_slots
from cache.testing import CheckedAllocator, CheckedSWAAllocator

VOCAB = 3
OP = st.tuples(
    st.sampled_from(["insert"] * 3 + ["match", "lock", "unlock", "evict"] + ["evict_swa"] * 2),
    st.integers(0, 1),  # base sequence
    st.integers(0, 40),  # cut into it
    st.lists(st.integers(0, VOCAB - 1), max_size=6),  # suffix
)
HISTORY = st.lists(OP, max_size=40)
SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Driver:
    """Runs ops on one tree and answers what each op returned (the values compared between twins)."""

    def __init__(self, tree, alloc, bases: list[list[int]]) -> None:
        self.tree, self.alloc, self.bases, self.locks = tree, alloc, bases, []
        self.swa = isinstance(tree, SWARadixCache)

    def tokens(self, base: int, cut: int, suffix: list[int]) -> list[int]:
        return self.bases[base][:cut] + suffix

    def evict(self, full: int, swa: int = 0):
        return self.tree.evict(full, swa) if self.swa else self.tree.evict(full)

    def run(self, op: str, base: int, cut: int, suffix: list[int]):
        tree, p, eagle = self.tree, self.tree.page_size, int(self.tree.eagle)
        toks = self.tokens(base, cut, suffix)
        if op == "insert":
            units = max(len(toks) - eagle, 0)
            units -= units % p
            if units == 0:
                return None
            slots = self.alloc.alloc(units)
            if slots is None:
                evicted = self.evict(units, units)
                slots = self.alloc.alloc(units)
                if slots is None:
                    return ("full", evicted)
            cached = tree.insert(toks[: units + eagle], slots)
            if not self.swa and cached:
                self.alloc.free(slots[:cached])  # the plain tree leaves duplicates to the caller
            return ("insert", cached, slots.tolist())
        if op == "match":
            return ("match", tree.match_prefix(toks).slots.tolist())
        if op == "lock":
            node = tree.match_prefix(toks).node
            if node is tree.root:
                return None
            self.locks.append((node, tree.inc_lock_ref(node)))
            return ("lock", node.num_units)
        if op == "unlock":
            if not self.locks:
                return None
            node, lock_id = self.locks.pop(cut % len(self.locks))
            tree.dec_lock_ref(node, lock_id)
            return ("unlock", node.num_units)
        if op == "evict":
            return ("evict", self.evict(cut % 5))
        return ("evict_swa", self.evict(0, cut % 5))  # the plain tree: a no-op eviction

    def release_all(self) -> None:
        while self.locks:
            self.run("unlock", 0, 0, [])


def make_tree(swa: bool, page_size: int, eagle: bool, window: int):
    if swa:
        alloc = CheckedSWAAllocator(80 * page_size, 40 * page_size, page_size)
        return SWARadixCache(alloc, sliding_window=window, page_size=page_size, eagle=eagle), alloc
    alloc = CheckedAllocator(80 * page_size, page_size)
    return RadixCache(alloc, page_size=page_size, eagle=eagle), alloc


def fresh_like(tree, alloc):
    if isinstance(tree, SWARadixCache):
        return SWARadixCache(alloc, sliding_window=tree.sliding_window, page_size=tree.page_size,
                             eagle=tree.eagle)
    return RadixCache(alloc, page_size=tree.page_size, eagle=tree.eagle)


def free_sets(alloc) -> tuple[frozenset, ...]:
    sets = [frozenset(alloc.free_slot_ids().tolist())]
    if isinstance(alloc, CheckedSWAAllocator):
        sets.append(frozenset(alloc.free_swa_slot_ids().tolist()))
    return tuple(sets)


def drain(driver: Driver) -> list:
    """Evict everything one unit at a time (SWA tree: tombstone first, then full eviction); each step's
    return value and the free sets after it."""
    steps, tree = [], driver.tree
    if driver.swa:
        while tree.swa_evictable_size:
            steps.append((driver.evict(0, 1), free_sets(driver.alloc)))
    while tree.num_nodes:
        steps.append((driver.evict(1, 0), free_sets(driver.alloc)))
    return steps


def build(swa: bool, page_size: int, eagle: bool, window: int, seed: int, history: list) -> Driver:
    tree, alloc = make_tree(swa, page_size, eagle, window * page_size)
    rng = np.random.default_rng(seed)
    bases = [rng.integers(0, VOCAB, 8 * page_size + 2).tolist() for _ in range(2)]
    driver = Driver(tree, alloc, bases)
    for op in history:
        driver.run(*op)
    driver.release_all()
    tree.check_invariants()
    return driver


CASE = {
    "swa": st.booleans(),
    "page_size": st.sampled_from([1, 2]),
    "eagle": st.booleans(),
    "window": st.integers(1, 3),
    "seed": st.integers(0, 2**16),
    "history": HISTORY,
}


@SETTINGS
@given(**CASE, after=HISTORY)
def test_an_imported_tree_behaves_as_the_exported_one(swa, page_size, eagle, window, seed, history,
                                                      after) -> None:
    original = build(swa, page_size, eagle, window, seed, history)
    state = original.tree.export_state()
    twin_alloc = copy.deepcopy(original.alloc)  # the same slots allocated, the same free order
    twin = Driver(fresh_like(original.tree, twin_alloc), twin_alloc, original.bases)
    twin.tree.import_state(state)
    twin.tree.check_invariants()
    assert twin.tree.export_state().equals(state)
    for op in after:
        assert twin.run(*op) == original.run(*op), op
        assert free_sets(twin.alloc) == free_sets(original.alloc)
    twin.tree.check_invariants([])
    original.release_all()
    twin.release_all()
    assert twin.tree.export_state().equals(original.tree.export_state())
    assert drain(twin) == drain(original)
    twin.tree.check_invariants()


@SETTINGS
@given(**CASE, queries=st.lists(OP, max_size=10))
def test_a_state_moved_to_a_fresh_allocator_behaves_the_same_up_to_slot_names(
        swa, page_size, eagle, window, seed, history, queries) -> None:
    original = build(swa, page_size, eagle, window, seed, history)
    state = original.tree.export_state()
    tree, alloc = make_tree(swa, page_size, eagle, window * page_size)
    moved = allocate_state_slots(state, alloc)
    tree.import_state(moved)
    tree.check_invariants()
    rename = dict(zip(state.slots.tolist(), moved.slots.tolist(), strict=True))
    assert tree.export_state().equals(moved)
    twin = Driver(tree, alloc, original.bases)
    for _op, base, cut, suffix in queries:  # matches only: inserts would take differently named slots
        want = original.run("match", base, cut, suffix)
        assert twin.run("match", base, cut, suffix) == ("match", [rename[s] for s in want[1]])
    moved_steps, steps = drain(twin), drain(original)
    assert [r for r, _ in moved_steps] == [r for r, _ in steps]
    assert tree.num_nodes == 0 and alloc.free_slot_ids().shape[0] == alloc.num_pages * page_size


def test_a_locked_tree_is_not_exported_and_bad_states_are_refused_unchanged() -> None:
    tree, alloc = make_tree(True, 1, False, 2)
    for toks in ([1, 2, 3, 4], [1, 2, 5], [7, 8]):
        tree.insert(toks, alloc.alloc(len(toks)))
    tree.evict(0, 2)  # tombstones [1, 2]
    state = tree.export_state()
    assert state.tombstone.tolist() == [True, False, False, False]
    node = tree.match_prefix([7, 8]).node
    lock_id = tree.inc_lock_ref(node)
    with pytest.raises(StateError, match="locked"):
        tree.export_state()
    tree.dec_lock_ref(node, lock_id)

    def refused(bad: TreeState, match: str, target=None) -> None:
        twin_alloc = copy.deepcopy(alloc)
        twin = target or fresh_like(tree, twin_alloc)
        before = twin.pretty()
        with pytest.raises(StateError, match=match):
            twin.import_state(bad)
        assert twin.pretty() == before

    refused(dataclasses.replace(state, parents=np.array([-1, 2, 0, -1])), "parent-first")
    refused(dataclasses.replace(state, full_lru=np.array([0, 0, 1, 2])), "full_lru")
    refused(dataclasses.replace(state, swa_lru=state.swa_lru[:-1]), "swa_lru")
    refused(dataclasses.replace(state, tombstone=np.array([False, False, False, True])), "leaf")
    refused(dataclasses.replace(state, slots=np.array([1, 2, 3, 4, 4, 6, 7])), "two nodes")
    refused(dataclasses.replace(state, tombstone=np.zeros(4, bool), swa_lru=np.arange(4)), "map")
    refused(dataclasses.replace(state, sliding_window=3), "sliding_window")
    refused(state, "free", SWARadixCache(CheckedSWAAllocator(30, 12), sliding_window=2))
    refused(state, "empty", tree)
    plain, _ = make_tree(False, 1, False, 1)
    refused(state, "sliding_window", plain)


def test_the_readme_example() -> None:
    """`cache/README.md`, "Export and import"."""
    tree, alloc = make_tree(True, 1, False, 2)
    for toks in ([1, 2, 3, 4], [1, 2, 5]):
        tree.insert(toks, alloc.alloc(len(toks)))
    assert tree.evict(0, 2) == (0, 2)
    state = tree.export_state()
    assert state.parents.tolist() == [-1, 0, 0] and state.tombstone.tolist() == [True, False, False]
    assert state.full_lru.tolist() == [0, 1, 2] and state.swa_lru.tolist() == [1, 2]
    assert [state.node_tokens(i).tolist() for i in range(3)] == [[1, 2], [3, 4], [5]]
