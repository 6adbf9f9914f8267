"""RadixCache basics: the cases of SGLang's `test_radix_cache_unit.py` that apply, and
the examples of "Matching" and "Inserting and splitting" in `cache/README.md`. Tests insert fresh slots from a
checked allocator and check ownership at the end."""

from __future__ import annotations

import numpy as np
import pytest

from cache import RadixCache
from cache.node import TreeNode
from cache.testing import CheckedAllocator
from tests.cache.radix_sim import make_cache


def insert_fresh(cache: RadixCache, tokens: list[int]) -> tuple[int, np.ndarray]:
    """Insert `tokens` with fresh slots and free the caller's duplicates, as a caller must."""
    units = len(tokens) - cache.eagle
    slots = cache.allocator.alloc(units)
    num_cached = cache.insert(tokens, slots)
    if num_cached:
        cache.allocator.free(slots[:num_cached])
    return num_cached, slots


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("disabled", [False, True])
def test_init_variations(page_size: int, disabled: bool) -> None:
    cache, _ = make_cache(64, page_size, disabled=disabled)
    assert cache.page_size == page_size and cache.disabled == disabled
    assert len(cache.root.key) == 0 and cache.root.num_units == 0 and cache.root.parent is None
    assert (cache.evictable_size, cache.protected_size, cache.total_size()) == (0, 0, 0)


def test_allocator_page_size_must_match() -> None:
    with pytest.raises(ValueError, match="page_size"):
        RadixCache(CheckedAllocator(64, 4), page_size=1)


def test_insert_and_match_basic() -> None:
    cache, alloc = make_cache(64)
    slots = alloc.alloc(3)
    assert cache.insert([1, 2, 3], slots) == 0
    assert cache.total_size() == 3 and cache.evictable_size == 3
    np.testing.assert_array_equal(cache.match_prefix([1, 2, 3]).slots, slots)
    np.testing.assert_array_equal(cache.match_prefix([1, 2]).slots, slots[:2])
    assert cache.check_invariants() == {"free": 61, "tree": 3, "live_only": 0}


def test_disabled_cache_matches_and_stores_nothing() -> None:
    cache, alloc = make_cache(64, disabled=True)
    slots = alloc.alloc(3)
    assert cache.insert([1, 2, 3], slots) == 0
    assert cache.total_size() == 0
    res = cache.match_prefix([1, 2, 3])
    assert res.slots.shape == (0,) and res.node is cache.root
    assert cache.evict(10) == 0
    alloc.free(slots)  # the caller kept them
    cache.check_invariants()


def test_total_size_grows_with_new_units_only() -> None:
    cache, _ = make_cache(64)
    insert_fresh(cache, [1, 2, 3])
    assert cache.total_size() == 3
    assert insert_fresh(cache, [1, 2, 3, 4, 5])[0] == 3
    assert cache.total_size() == 5
    cache.check_invariants()


def test_reset_frees_everything_and_empties_the_tree() -> None:
    cache, alloc = make_cache(64)
    insert_fresh(cache, [1, 2, 3])
    insert_fresh(cache, [1, 5])
    cache.reset()
    assert (cache.evictable_size, cache.protected_size, cache.total_size(), cache.num_nodes) == (0, 0, 0, 0)
    assert alloc.available_size() == 64
    assert cache.match_prefix([1, 2, 3]).slots.shape == (0,)
    cache.check_invariants()


def test_reset_refuses_while_locked() -> None:
    from cache import EvictLockedError

    cache, _ = make_cache(64)
    insert_fresh(cache, [1, 2, 3])
    node = cache.match_prefix([1, 2, 3]).node
    cache.inc_lock_ref(node)
    before = cache.pretty()
    with pytest.raises(EvictLockedError):
        cache.reset()
    assert cache.pretty() == before


def test_extra_key_isolation() -> None:
    cache, alloc = make_cache(64)
    tokens = [1, 2, 3]
    values = {}
    for extra in ("key1", "key2", None):
        values[extra] = alloc.alloc(3)
        assert cache.insert(tokens, values[extra], extra_key=extra) == 0  # no sharing across namespaces
    for extra, slots in values.items():
        np.testing.assert_array_equal(cache.match_prefix(tokens, extra_key=extra).slots, slots)
    assert cache.match_prefix(tokens, extra_key="unknown").slots.shape == (0,)
    assert cache.total_size() == 9
    cache.check_invariants()


def test_lock_ref_moves_units_between_evictable_and_protected() -> None:
    cache, _ = make_cache(64)
    insert_fresh(cache, [1, 2, 3])
    node = cache.match_prefix([1, 2, 3]).node
    assert cache.inc_lock_ref(node) is None  # the plain tree has no lock ids
    assert (cache.evictable_size, cache.protected_size) == (0, 3)
    cache.inc_lock_ref(node)
    assert (cache.evictable_size, cache.protected_size, node.lock_ref) == (0, 3, 2)
    cache.dec_lock_ref(node)
    cache.dec_lock_ref(node)
    assert (cache.evictable_size, cache.protected_size, node.lock_ref) == (3, 0, 0)
    cache.inc_lock_ref(cache.root)  # locking the root (nothing matched) is a no-op
    cache.dec_lock_ref(cache.root)
    cache.check_invariants()


def test_evict_frees_through_the_allocator() -> None:
    cache, alloc = make_cache(64)
    insert_fresh(cache, [1, 2, 3])
    freed = []
    real_free = alloc.free
    alloc.free = lambda slots: (freed.append(np.array(slots)), real_free(slots))  # type: ignore[method-assign]
    assert cache.evict(3) == 3
    assert len(freed) == 1 and sorted(freed[0].tolist()) == [1, 2, 3]
    assert cache.total_size() == 0 and alloc.available_size() == 64


@pytest.mark.parametrize(("page_size", "num_tokens"), [(1, 5), (2, 5), (4, 6)])
def test_page_alignment_boundary(page_size: int, num_tokens: int) -> None:
    cache, alloc = make_cache(64, page_size)
    tokens = list(range(1, num_tokens + 1))
    units = num_tokens - num_tokens % page_size
    cache.insert(tokens[:units], alloc.alloc(units))
    matched = cache.match_prefix(tokens).slots.shape[0]
    assert matched > 0 and matched % page_size == 0
    cache.check_invariants()


def test_pretty_print_shows_keys_slots_and_locks() -> None:
    cache, _ = make_cache(64)
    insert_fresh(cache, [1, 2, 3])
    insert_fresh(cache, [1, 2, 4, 5])
    cache.inc_lock_ref(cache.match_prefix([1, 2, 4, 5]).node)
    text = cache.pretty()
    assert text.splitlines() == [
        "root (page_size=1)",
        "└─ [1, 2] (2 units) slots=[1, 2] lock=1",
        "   ├─ [3] (1 units) slots=[3] lock=0",
        "   └─ [4, 5] (2 units) slots=[6, 7] lock=1",
    ]
    assert "RadixCache(" in repr(cache) and "protected=4" in repr(cache)


def test_all_values_are_the_inserted_slots() -> None:
    cache, alloc = make_cache(64)
    a, b = alloc.alloc(2), alloc.alloc(2)
    cache.insert([1, 2], a)
    cache.insert([3, 4], b)
    values = set(np.concatenate([n.value for n in cache.iter_nodes()]).tolist())
    assert values == set(a.tolist()) | set(b.tolist())


@pytest.mark.parametrize("page_size", [1, 2])
def test_advanced_prefix_match_with_node_splits(page_size: int) -> None:
    cache, alloc = make_cache(64, page_size)
    seq1, seq2 = [1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 9, 10]
    val1 = alloc.alloc(8)
    val2 = alloc.alloc(4)
    assert cache.insert(seq1, val1) == 0
    assert cache.insert(seq2, val2) == 2
    alloc.free(val2[:2])
    assert cache.total_size() == 10
    np.testing.assert_array_equal(cache.match_prefix([1, 2, 3, 4, 999, 1000]).slots, val1[:4])
    assert cache.total_size() == 10  # a split changes no accounting
    np.testing.assert_array_equal(cache.match_prefix(seq1).slots, val1)
    np.testing.assert_array_equal(cache.match_prefix([1, 2, 3, 4, 5, 6, 777, 888]).slots, val1[:6])
    np.testing.assert_array_equal(cache.match_prefix(seq2).slots, np.concatenate([val1[:2], val2[2:]]))
    cache.check_invariants()


def test_match_splits_node_example_p1() -> None:
    """[1..5] -> slots; matching [1,2,3,9] splits into [1,2,3] + [4,5] and ends at the upper node."""
    cache, alloc = make_cache(64)
    slots = alloc.alloc(5)
    cache.insert([1, 2, 3, 4, 5], slots)
    res = cache.match_prefix([1, 2, 3, 9])
    np.testing.assert_array_equal(res.slots, slots[:3])
    assert res.node.key.tokens.tolist() == [1, 2, 3]
    assert [c.key.tokens.tolist() for c in res.node.children.values()] == [[4, 5]]
    assert cache.num_nodes == 2
    cache.check_invariants()


def test_match_truncates_and_splits_example_p4() -> None:
    """P=4, tree [1..8]; [1..7] matches 4; [1,2,3,4,5,6,9,9] matches 4 and splits [1..8] in two pages."""
    cache, alloc = make_cache(64, 4)
    slots = alloc.alloc(8)
    cache.insert(list(range(1, 9)), slots)
    res = cache.match_prefix([1, 2, 3, 4, 5, 6, 9, 9])
    np.testing.assert_array_equal(res.slots, slots[:4])
    assert cache.num_nodes == 2 and res.node.key.tokens.tolist() == [1, 2, 3, 4]
    res = cache.match_prefix([1, 2, 3, 4, 5, 6, 7])  # truncated to one page
    np.testing.assert_array_equal(res.slots, slots[:4])
    assert cache.num_nodes == 2
    cache.check_invariants()


def test_insert_ending_mid_node_splits_and_returns_full_length() -> None:
    """With [1,2,3,4] cached, inserting [1,2] splits it into [1,2] + [3,4] and returns 2."""
    cache, alloc = make_cache(64)
    cache.insert([1, 2, 3, 4], alloc.alloc(4))
    dup = alloc.alloc(2)
    assert cache.insert([1, 2], dup) == 2
    alloc.free(dup)
    assert cache.num_nodes == 2
    assert sorted(len(n.key) for n in cache.iter_nodes()) == [2, 2]
    cache.check_invariants()


def test_tree_node_ids_increase_and_order_by_last_access() -> None:
    cache, alloc = make_cache(64)
    cache.insert([1], alloc.alloc(1))
    cache.insert([2], alloc.alloc(1))
    n1, n2 = cache.match_prefix([1]).node, cache.match_prefix([2]).node
    assert isinstance(n1, TreeNode) and n1.id < n2.id
    assert n1 < n2  # n1 was touched first
    cache.match_prefix([1])
    assert n2 < n1


def test_new_leaf_node_fields() -> None:
    cache, alloc = make_cache(64)
    slots = alloc.alloc(3)
    cache.insert([1, 2, 3], slots)
    (node,) = cache.iter_nodes()
    assert node.parent is cache.root and node.children == {} and node.lock_ref == 0
    assert (
        node.num_units == 3
        and node.value.tolist() == slots.tolist()
        and node.key.tokens.tolist() == [1, 2, 3]
    )
    assert cache.root.lock_ref == 1  # the root is permanently "locked": never evicted (G3)
