"""Edge cases of the SWA tree: keys under EAGLE and pages, splits, duplicate frees, chunks, extra keys (the
allocator-only cases are covered by `CheckedSWAAllocator` and the ownership checks), plus the disabled mode
and `pretty()`."""

from __future__ import annotations

import numpy as np
import pytest

from cache import CachedReq, RadixKey
from tests.cache.swa_sim import extend_slots, make_swa


def test_eagle_empty_and_one_token_keys() -> None:
    """A 1-token key has no bigram: match gives root/0, insert stores nothing; the caller keeps its
    slot (and frees it)."""
    tree, alloc = make_swa(16, 16, window=2, eagle=True)
    slots, node = tree.match_prefix([5])
    assert slots.shape[0] == 0 and node is tree.root
    assert tree.match_prefix([]).slots.shape[0] == 0
    slot = alloc.alloc(1)
    assert tree.insert([5], slot) == 0
    assert tree.num_nodes == 0
    alloc.free(slot)
    assert tree.check_invariants()["free"] == 16


def test_bigram_key_is_idempotent_and_callers_key_is_not_mutated() -> None:
    """A key already in bigram form is not converted again; ours never rewrites the caller's
    key or array (deliberate difference from SGLang's in-place conversion)."""
    tree, alloc = make_swa(32, 32, window=2, eagle=True)
    tokens = np.array([1, 2, 3, 4, 5])
    tree.insert(tokens, alloc.alloc(5)[:4])
    key = RadixKey.of(tokens)
    as_bigram = key.as_bigram()
    assert tree.match_prefix(key).slots.tolist() == tree.match_prefix(as_bigram).slots.tolist()
    assert len(tree.match_prefix(as_bigram).slots) == 4
    assert key.bigram is False and tokens.tolist() == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(("eagle", "query_len"), [(False, 7), (True, 8)])
def test_paged_match_is_floored_to_pages(eagle: bool, query_len: int) -> None:
    """P=4: a 7-token query (or 8 tokens = 7 bigrams) matches at most 4."""
    tree, alloc = make_swa(64, 64, window=4, page_size=4, eagle=eagle)
    tokens = list(range(1, 14))
    units = 12
    slots = alloc.alloc(units)
    tree.insert(tokens[: units + eagle], slots)
    got = tree.match_prefix(tokens[:query_len]).slots
    assert got.tolist() == slots[:4].tolist()


@pytest.mark.parametrize(("eagle", "kept"), [(False, 8), (True, 4)])
def test_page_multiple_finish_drops_a_page_under_eagle(eagle: bool, kept: int) -> None:
    """N = 8 computed tokens at P = 4: non-EAGLE keeps 8, EAGLE keeps 4 and frees the second page."""
    tree, _alloc = make_swa(64, 64, window=4, page_size=4, eagle=eagle)
    req = CachedReq(last_node=tree.root)
    prompt = list(range(1, 8))
    tree.admit(req, prompt)
    assert extend_slots(tree, req, 8)
    tree.cache_finished_req(req, [*prompt, 50, 51])  # 9 tokens, the last one sampled only: n = 8
    assert tree.total_size() == kept
    assert tree.check_invariants() == {"free": 64 - kept, "tree": kept, "live_only": 0, "swa_free": 64 - kept}


def test_match_split_keeps_locks_and_accounting_and_inherits_tombstone() -> None:
    """A split made by a match keeps lock counts on both halves and changes no accounting; a split
    tombstone gives two tombstones."""
    tree, alloc = make_swa(64, 64, window=2)
    tree.insert([1, 2, 3, 4], alloc.alloc(4))
    tree.insert([1, 2, 3, 4, 5, 6], alloc.alloc(6))
    tree.match_prefix([1, 2, 3, 4, 5, 6])
    assert tree.evict(0, 4) == (0, 4)  # [1,2,3,4] tombstoned
    leaf = tree.match_prefix([1, 2, 3, 4, 5, 6]).node
    uuid = tree.inc_lock_ref(leaf)
    sizes = (
        tree.full_evictable_size,
        tree.full_protected_size,
        tree.swa_evictable_size,
        tree.swa_protected_size,
    )
    tree.match_prefix([1, 2, 9])  # splits the tombstone; the window rule answers 0
    tombs = sorted(n.key.tokens.tolist() for n in tree.iter_nodes() if n.tombstone)
    assert tombs == [[1, 2], [3, 4]]
    assert all(n.full_lock_ref == 1 for n in tree.iter_nodes())
    assert (
        tree.full_evictable_size,
        tree.full_protected_size,
        tree.swa_evictable_size,
        tree.swa_protected_size,
    ) == sizes
    tree.dec_lock_ref(leaf, uuid)
    tree.check_invariants()


def test_insert_ending_mid_node_splits_and_returns_its_length() -> None:
    """With [1,2,3,4] cached, inserting [1,2] splits it and returns 2."""
    tree, alloc = make_swa(32, 32, window=2)
    tree.insert([1, 2, 3, 4], alloc.alloc(4))
    dup = alloc.alloc(2)
    assert tree.insert([1, 2], dup) == 2
    assert sorted(n.num_units for n in tree.iter_nodes()) == [2, 2]
    assert tree.check_invariants()["free"] == 28  # the caller's duplicates were freed by the insert


def test_insert_frees_duplicates_only_beyond_prev_prefix_len_and_never_the_nodes_own() -> None:
    """The SWA insert frees the caller's duplicates itself, from prev_prefix_len on; slots equal to
    the node's own are the tree's and are never freed (a caller passing back what it matched is safe)."""
    tree, alloc = make_swa(32, 32, window=2)
    first = alloc.alloc(4)
    tree.insert([1, 2, 3, 4], first)
    mine = np.concatenate([first[:2], alloc.alloc(4)])
    free_before = alloc.full_available_size()
    assert tree.insert([1, 2, 3, 4, 5, 6], mine, prev_prefix_len=2) == 4
    assert alloc.full_available_size() == free_before + 2  # mine[2:4] only
    assert tree.insert([1, 2, 3, 4, 5, 6], tree.match_prefix([1, 2, 3, 4, 5, 6]).slots) == 6
    assert alloc.full_available_size() == free_before + 2
    tree.check_invariants()


def test_chunked_paged_request_keeps_its_partial_page() -> None:
    """After a chunk at P=4, prefix_len counts the partial page, which stays the request's."""
    tree, _alloc = make_swa(64, 64, window=4, page_size=4)
    prompt = list(range(1, 12))
    req = CachedReq(last_node=tree.root)
    tree.admit(req, prompt)
    assert extend_slots(tree, req, 6)
    assert tree.cache_unfinished_req(req, prompt[:6]) == (0, 4)
    assert (req.prefix_len, req.last_matched_prefix_len) == (6, 4)
    assert tree.check_invariants([req])["live_only"] == 2
    assert extend_slots(tree, req, 5)  # continues the partial page, then a fresh one
    assert req.kv_slots[5] == req.kv_slots[4] + 1
    tree.cache_finished_req(req, [*prompt, 60])
    assert tree.check_invariants() == {"free": 56, "tree": 8, "live_only": 0, "swa_free": 56}


def test_extra_keys_never_share_nodes() -> None:
    """The same tokens under different extra keys never share a node."""
    tree, alloc = make_swa(32, 32, window=2)
    a, b = alloc.alloc(3), alloc.alloc(3)
    assert tree.insert([1, 2, 3], a, extra_key="lora1") == 0
    assert tree.insert([1, 2, 3], b, extra_key="lora2") == 0
    assert tree.match_prefix([1, 2, 3], extra_key="lora1").slots.tolist() == a.tolist()
    assert tree.match_prefix([1, 2, 3], extra_key="lora2").slots.tolist() == b.tolist()
    assert tree.match_prefix([1, 2, 3]).slots.shape[0] == 0
    req = CachedReq(last_node=tree.root, extra_key="lora2")
    assert tree.admit(req, [1, 2, 3, 4]) == 3
    assert req.kv_slots.tolist() == b.tolist()
    tree.release_req(req)
    tree.check_invariants()


def test_disabled_tree_caches_nothing_and_request_ops_free_directly() -> None:
    """Same API; matches are empty, locks are no-ops, finishing frees every slot of the request."""
    tree, alloc = make_swa(32, 32, window=2, disabled=True)
    slots = alloc.alloc(3)
    assert tree.insert([1, 2, 3], slots) == 0
    assert tree.match_prefix([1, 2, 3]).slots.shape[0] == 0
    assert tree.evict(10, 10) == (0, 0)
    alloc.free(slots)
    req = CachedReq(last_node=tree.root)
    assert tree.admit(req, [1, 2, 3, 4]) == 0 and req.lock_id is None
    assert extend_slots(tree, req, 3)
    assert tree.cache_unfinished_req(req, [1, 2, 3]) == (0, 0)
    assert req.prefix_len == 3
    assert extend_slots(tree, req, 2)
    tree.cache_finished_req(req, [1, 2, 3, 4, 5, 6])
    assert tree.check_invariants() == {"free": 32, "tree": 0, "live_only": 0, "swa_free": 32}


def test_release_keeps_the_trees_slots_and_frees_the_private_tail() -> None:
    tree, alloc = make_swa(32, 32, window=2)
    tree.insert([1, 2, 3, 4], alloc.alloc(4))
    req = CachedReq(last_node=tree.root)
    assert tree.admit(req, [1, 2, 3, 4, 5]) == 4
    assert extend_slots(tree, req, 3)
    assert tree.check_invariants([req])["live_only"] == 3
    tree.release_req(req)
    assert req.kv_slots.shape[0] == 0 and req.last_node is tree.root and req.lock_id is None
    assert tree.check_invariants() == {"free": 28, "tree": 4, "live_only": 0, "swa_free": 28}


def test_reset_frees_everything_unless_locked() -> None:
    tree, alloc = make_swa(32, 32, window=2)
    tree.insert([1, 2, 3, 4], alloc.alloc(4))
    tree.insert([1, 2, 7], alloc.alloc(3))
    tree.match_prefix([1, 2, 3, 4])
    tree.evict(0, 2)
    assert any(n.tombstone for n in tree.iter_nodes())
    tree.reset()
    assert tree.num_nodes == 0
    assert tree.check_invariants() == {"free": 32, "tree": 0, "live_only": 0, "swa_free": 32}


def test_pretty_shows_tombstones_locks_and_uuids() -> None:
    tree, alloc = make_swa(32, 32, window=2)
    tree.insert([1, 2, 3], alloc.alloc(3))
    tree.insert([1, 2, 3, 4, 5], alloc.alloc(5))
    leaf = tree.match_prefix([1, 2, 3, 4, 5]).node
    tree.evict(0, 3)
    uuid = tree.inc_lock_ref(leaf)
    text = tree.pretty()
    assert "TOMBSTONE" in text and f"uuid={uuid}" in text and "lock=full:1/swa:1" in text
    assert text.splitlines()[1].startswith("└─ [1, 2, 3] (3 units)")
    assert "SWARadixCache(sliding_window=2" in repr(tree)
