"""The SWA tree's own rules on the worked examples of `cache/README.md`: the sliding-window match rule, locks
and swa_uuid, the two eviction phases and the tombstone cascade, and revival, plus the upstream ownership
defect that revival must not repeat ("Where we differ from SGLang")."""

from __future__ import annotations

import numpy as np
import pytest

from cache import CachedReq, SWARadixCache
from cache.testing import CheckedSWAAllocator
from tests.cache.swa_sim import extend_slots, make_swa

A, B, C = [1, 2, 3], [4, 5], [6, 7, 8]


def build_abc(window: int, tombstone: str) -> tuple[SWARadixCache, CheckedSWAAllocator]:
    """Path root -> A(3) -> B(2) -> C(3), then SWA eviction tombstones exactly the node named `tombstone`
    (by making it the least recently used live node). No locks are held afterwards."""
    tree, alloc = make_swa(64, 64, window=window)
    for seq in (A, A + B, A + B + C):
        tree.insert(seq, alloc.alloc(len(seq)))
    if tombstone == "A":
        tree.match_prefix(A + B + C)  # ancestors older than descendants: A is the LRU live node
        assert tree.evict(0, 3) == (0, 3)
    else:
        tree.match_prefix(A)  # A becomes most recent, B the LRU
        assert tree.evict(0, 2) == (0, 2)
    (tomb,) = [n for n in tree.iter_nodes() if n.tombstone]
    assert tomb.key.tokens.tolist() == {"A": A, "B": B}[tombstone]
    tree.check_invariants()
    return tree, alloc


@pytest.mark.parametrize(("window", "matched"), [(4, 8), (5, 8), (6, 0)])
def test_window_rule_example_1_tombstone_at_root_side(window: int, matched: int) -> None:
    """Window rule example 1: A(3,T) B(2) C(3): 5 live units after the tombstone; enough for W <= 5, else
    nothing."""
    tree, _ = build_abc(window, "A")
    slots, node = tree.match_prefix(A + B + C)
    assert slots.shape[0] == matched
    assert node is (tree.root if matched == 0 else tree.match_prefix(A + B + C).node)
    if matched:
        assert node.key.tokens.tolist() == C


def test_window_rule_example_2_falls_back_before_the_tombstone() -> None:
    """Window rule example 2: A(3) B(2,T) C(3), W=4: the 3 live units of C are too few, so the match ends at
    A."""
    tree, _ = build_abc(4, "B")
    slots, node = tree.match_prefix(A + B + C)
    assert slots.shape[0] == 3
    assert node.key.tokens.tolist() == A
    # W=3 would accept C: the rule counts whole live nodes after the last tombstone
    tree.sliding_window = 3
    assert tree.match_prefix(A + B + C).slots.shape[0] == 8


def test_window_rule_still_splits_where_the_walk_ended() -> None:
    """Node splitting happens even when the window rule answers shorter."""
    tree, _ = build_abc(6, "A")
    nodes_before = tree.num_nodes
    assert tree.match_prefix(A + B + [6, 7, 99]).slots.shape[0] == 0
    assert tree.num_nodes == nodes_before + 1
    assert sorted(n.num_units for n in tree.iter_nodes()) == [1, 2, 2, 3]
    tree.check_invariants()


def test_window_counter_resets_at_every_tombstone() -> None:
    """A(3,T) B(2) C(2,T) D(3), W=4: B's 2 live units do not carry over C's tombstone; only D (3 < 4)
    follows it, so the answer falls back to the root (the first tombstone was met with since=inf). SGLang
    0.5.3.post1 reset the counter only when it recorded a new best, and would have answered 10 here."""
    tree, alloc = make_swa(64, 64, window=4)
    seqs = [A, A + B, A + B + [6, 7], A + B + [6, 7, 8, 9, 10]]
    for seq in seqs:
        tree.insert(seq, alloc.alloc(len(seq)))
    tree.match_prefix(A + B)  # live list, LRU first: C, D, A, B -> C is tombstoned
    assert tree.evict(0, 2) == (0, 2)
    own = np.concatenate([n.value for n in tree._path(tree.match_prefix(A + B).node)])
    d_node = next(n for n in tree.iter_nodes() if n.key.tokens.tolist() == [8, 9, 10])
    own = np.concatenate([own, d_node.parent.value, d_node.value])
    # with its own slots: touches A, B, C, D and frees nothing
    assert tree.insert(A + B + [6, 7, 8, 9, 10], own) == 10
    assert tree.evict(0, 3) == (0, 3)  # live list, LRU first: A, B, D -> A is tombstoned
    assert sorted(n.key.tokens.tolist() for n in tree.iter_nodes() if n.tombstone) == [A, [6, 7]]
    assert tree.match_prefix(A + B + [6, 7, 8, 9, 10]).slots.shape[0] == 0
    assert tree.match_prefix(A + B).slots.shape[0] == 0  # B alone (2 < 4) after A's tombstone
    tree.sliding_window = 2
    assert tree.match_prefix(A + B + [6, 7, 8, 9, 10]).slots.shape[0] == 10
    tree.check_invariants()


# ---------------------------------------------------------------- locks and swa_uuid


def path_a2_b3(window: int) -> tuple[SWARadixCache, object, object]:
    tree, alloc = make_swa(64, 64, window=window)
    tree.insert([1, 2], alloc.alloc(2))
    tree.insert([1, 2, 3, 4, 5], alloc.alloc(5))
    node_b = tree.match_prefix([1, 2, 3, 4, 5]).node
    return tree, node_b.parent, node_b


def test_lock_w4_swa_locks_both_nodes_and_tags_the_upper() -> None:
    tree, a, b = path_a2_b3(4)
    uuid = tree.inc_lock_ref(b)
    assert uuid is not None and a.swa_uuid == uuid and b.swa_uuid is None
    assert (a.full_lock_ref, a.swa_lock_ref, b.full_lock_ref, b.swa_lock_ref) == (1, 1, 1, 1)
    assert (tree.full_protected_size, tree.swa_protected_size) == (5, 5)
    assert (tree.full_evictable_size, tree.swa_evictable_size) == (0, 0)
    tree.dec_lock_ref(b, uuid)
    assert (a.full_lock_ref, a.swa_lock_ref, b.full_lock_ref, b.swa_lock_ref) == (0, 0, 0, 0)
    assert (tree.full_evictable_size, tree.swa_evictable_size) == (5, 5)
    tree.check_invariants()


def test_lock_w2_swa_locks_only_the_window() -> None:
    tree, a, b = path_a2_b3(2)
    uuid = tree.inc_lock_ref(b)
    assert uuid == b.swa_uuid and a.swa_uuid is None
    assert (a.full_lock_ref, a.swa_lock_ref, b.full_lock_ref, b.swa_lock_ref) == (1, 0, 1, 1)
    assert (tree.full_protected_size, tree.swa_protected_size, tree.swa_evictable_size) == (5, 3, 2)
    tree.check_invariants()
    # A is outside the window: SWA eviction may tombstone it while the lock holds
    assert tree.evict(0, 10) == (0, 2)
    assert a.tombstone and not b.tombstone
    tree.dec_lock_ref(b, uuid)
    tree.check_invariants()


def test_lock_window_longer_than_path_returns_none_and_unlocks_to_root() -> None:
    tree, a, b = path_a2_b3(10)
    assert tree.inc_lock_ref(b) is None
    assert (a.swa_lock_ref, b.swa_lock_ref) == (1, 1)
    tree.dec_lock_ref(b, None)
    assert (a.swa_lock_ref, b.swa_lock_ref, a.full_lock_ref) == (0, 0, 0)
    tree.check_invariants()


def test_two_locks_ending_on_the_same_node_share_its_uuid() -> None:
    tree, a, b = path_a2_b3(4)
    u1, u2 = tree.inc_lock_ref(b), tree.inc_lock_ref(b)
    assert u1 == u2 == a.swa_uuid
    assert (a.swa_lock_ref, b.swa_lock_ref) == (2, 2)
    tree.dec_lock_ref(b, u1)
    tree.dec_lock_ref(b, u2)
    assert tree.swa_protected_size == 0
    tree.check_invariants()


def test_split_of_a_locked_node_moves_the_uuid_up_and_dec_unlocks_the_same_set() -> None:
    """The upper half takes the uuid, both halves keep the counts; accounting unchanged."""
    tree, a, b = path_a2_b3(4)
    uuid = tree.inc_lock_ref(b)
    sizes = (tree.full_protected_size, tree.swa_protected_size, tree.full_evictable_size)
    upper = tree.match_prefix([1, 9]).node  # splits A = [1, 2] into [1] + [2]
    assert upper.key.tokens.tolist() == [1] and a.key.tokens.tolist() == [2]
    assert upper.swa_uuid == uuid and a.swa_uuid is None
    assert (upper.full_lock_ref, upper.swa_lock_ref) == (1, 1)
    assert (tree.full_protected_size, tree.swa_protected_size, tree.full_evictable_size) == sizes
    tree.check_invariants()
    tree.dec_lock_ref(b, uuid)
    assert all(n.full_lock_ref == n.swa_lock_ref == 0 for n in tree.iter_nodes())
    tree.check_invariants()


# ---------------------------------------------------------------- eviction phases


def test_full_phase_counts_swa_and_skips_the_swa_phase_when_enough() -> None:
    """Phase 1 frees a 3-unit leaf on both sides; an SWA request of 3 is then already met."""
    tree, alloc = make_swa(64, 64, window=2)
    tree.insert([1, 2, 3, 4], alloc.alloc(4))
    tree.insert([1, 2, 7, 8, 9], alloc.alloc(5))  # leaves [3,4] (older) and [7,8,9]
    tree.insert([1, 2, 7, 8, 9], alloc.alloc(5))  # touch the newer leaf again
    assert tree.evict(1, 2) == (2, 2)
    assert not any(n.tombstone for n in tree.iter_nodes())
    # phase 1 stops after the leaf [7,8,9] (3 >= 1); phase 2 needs 2 more SWA: [1,2], now a leaf, goes whole
    assert tree.evict(1, 5) == (5, 5)
    assert tree.num_nodes == 0
    tree.check_invariants()


def test_swa_phase_tombstones_root_side_first_and_deletes_leaves() -> None:
    tree, alloc = make_swa(64, 64, window=2)
    tree.insert([1, 2, 3, 4, 5, 6], alloc.alloc(6))
    tree.insert([1, 2, 3, 4], alloc.alloc(4))
    tree.insert([1, 2], alloc.alloc(2))
    tree.match_prefix([1, 2, 3, 4, 5, 6])
    assert tree.evict(0, 2) == (0, 2)
    assert [n.key.tokens.tolist() for n in tree.iter_nodes() if n.tombstone] == [[1, 2]]
    # [3,4] tombstoned (SWA 2), then the leaf [5,6] deleted (full 2, SWA 2), and with it its tombstone
    # parents [3,4] and [1,2] (full 2 + 2): S4, no tombstone may be left as a leaf
    assert tree.evict(0, 3) == (6, 4)
    assert tree.num_nodes == 0
    tree.check_invariants()


def test_cascade_frees_tombstone_parents_and_counts_them_as_full() -> None:
    """Evicting the last child of a tombstone deletes the tombstone too."""
    tree, alloc = make_swa(64, 64, window=2)
    tree.insert([1, 2, 3], alloc.alloc(3))
    tree.insert([1, 2, 3, 4, 5], alloc.alloc(5))
    tree.match_prefix([1, 2, 3, 4, 5])
    assert tree.evict(0, 3) == (0, 3)  # [1,2,3] tombstoned
    free_before = alloc.full_available_size()
    assert tree.evict(1, 0) == (5, 2)  # leaf [4,5]: 2 full + 2 SWA, then tombstone [1,2,3]: 3 full
    assert alloc.full_available_size() == free_before + 5
    assert tree.num_nodes == 0
    assert tree.check_invariants() == {"free": 64, "tree": 0, "live_only": 0, "swa_free": 64}


def test_locked_nodes_are_skipped_and_eviction_stops_short() -> None:
    """Everything locked -> evict frees what it can and returns the shortfall, no error."""
    tree, alloc = make_swa(64, 64, window=8)
    req = CachedReq(last_node=tree.root)
    tree.insert([1, 2, 3, 4], alloc.alloc(4))
    tree.insert([5, 6], alloc.alloc(2))
    tree.admit(req, [1, 2, 3, 4, 9])
    assert tree.evict(10, 10) == (2, 2)  # only [5,6]
    assert tree.evict(10, 10) == (0, 0)
    tree.check_invariants([req])
    tree.release_req(req)
    assert tree.evict(10, 10) == (4, 4)


def test_full_phase_restarts_when_a_parent_becomes_an_older_leaf() -> None:
    """A parent left childless may be older than the scan position: it is found again."""
    tree, alloc = make_swa(64, 64, window=2)
    tree.insert([1, 2, 3, 4], alloc.alloc(4))
    tree.insert([1, 2, 5, 6], alloc.alloc(4))  # [1,2] -> {[3,4], [5,6]}
    tree.insert([7, 8], alloc.alloc(2))  # full list, LRU first: [1,2], [3,4], [5,6], [7,8]
    assert tree.evict(6, 0) == (6, 6)  # [3,4], [5,6], then [1,2] (now a leaf, older) before [7,8]
    assert [n.key.tokens.tolist() for n in tree.iter_nodes()] == [[7, 8]]


# ---------------------------------------------------------------- revival and the upstream revival defect


def test_revival_keeps_full_slots_adopts_swa_and_frees_the_callers_full_slots() -> None:
    tree, alloc = build_abc(6, "A")
    tomb = next(n for n in tree.iter_nodes() if n.tombstone)
    old_full = tomb.value.copy()
    assert tree.match_prefix(A + B + C).slots.shape[0] == 0
    fresh = alloc.alloc(8)
    fresh_swa = alloc.swa_slots_of(fresh[:3])
    free_full, free_swa = alloc.full_available_size(), alloc.swa_available_size()
    assert tree.insert(A + B + C, fresh) == 8
    assert not tomb.tombstone and np.array_equal(tomb.value, old_full)
    assert np.array_equal(alloc.swa_slots_of(old_full), fresh_swa)
    assert alloc.full_available_size() == free_full + 8  # 3 revived (full only) + 5 duplicates
    assert alloc.swa_available_size() == free_swa + 5  # the revived node keeps the caller's 3 SWA slots
    assert (tree.swa_evictable_size, tree.total_swa_size()) == (8, 8)
    assert tree.match_prefix(A + B + C).slots.shape[0] == 8
    tree.check_invariants()


def test_revival_only_beyond_prev_prefix_len_splits_the_tombstone() -> None:
    """A tombstone [1,2,3] overlapped from position 2 on: [1,2] stays a tombstone, [3] is revived."""
    tree, alloc = build_abc(6, "A")
    tomb = next(n for n in tree.iter_nodes() if n.tombstone)
    mine = np.concatenate([tomb.value[:2], alloc.alloc(6)])  # positions 0-1: the tree's slots
    assert tree.insert(A + B + C, mine, prev_prefix_len=2) == 8
    tombs = [n.key.tokens.tolist() for n in tree.iter_nodes() if n.tombstone]
    assert tombs == [[1, 2]]
    tree.check_invariants()


def test_revival_under_a_live_request_keeps_its_slots_valid() -> None:
    """R1 reads A beyond its window (full lock only); SWA eviction tombstones A; R2 recomputes A and
    inserts it. SGLang 0.5.3.post1 freed A's old full slots, which R1's kv_slots still point at; here A keeps
    them and R1 stays valid through the whole run."""
    tree, alloc = make_swa(64, 64, window=3)
    prompt = A + B + C + [9]
    for seq in (A, A + B, A + B + C):
        tree.insert(seq, alloc.alloc(len(seq)))
    r1 = CachedReq(last_node=tree.root)
    assert tree.admit(r1, prompt) == 8
    a_node = tree._path(r1.last_node)[0]
    assert a_node.full_lock_ref == 1 and a_node.swa_lock_ref == 0  # W=3: only C is SWA-locked
    assert tree.evict(0, 5) == (0, 5)  # A and B tombstoned under R1's lock
    tree.check_invariants([r1])
    r2 = CachedReq(last_node=tree.root)
    assert tree.admit(r2, prompt) == 8  # C alone (3 units) satisfies W=3
    tree.release_req(r2)
    r2 = CachedReq(last_node=tree.root)
    assert tree.admit(r2, [1, 2, 3, 4, 99]) == 0  # cannot stop inside tombstones
    r2.kv_slots = alloc.alloc(5)
    tree.cache_finished_req(r2, [1, 2, 3, 4, 99, 900])  # revives A; splits B
    assert not a_node.tombstone
    tree.check_invariants([r1])
    r1.kv_slots = np.concatenate([r1.kv_slots, alloc.alloc(1)])
    tree.cache_finished_req(r1, [*prompt, 900])
    assert tree.check_invariants()["live_only"] == 0


def test_chunked_paged_eagle_duplicate_page_is_freed_whole_and_replaced() -> None:
    """The chunked-EAGLE page defect, for the SWA tree: P=4, EAGLE, chunked. After chunk 1 (6 tokens) the
    tree holds 4 units and the request privately holds positions 4-5 on a page of its own. Another request
    then caches the same prompt. SGLang would pass prev_prefix_len = 6 - 1 = 5 and free the duplicate range
    from position 5, i.e. the
    page of positions 4-7 that the request still reads at position 4. Here the range starts at 4 (the
    page-aligned tree-owned length): that whole page is the request's and is replaced by the tree's."""
    tree, alloc = make_swa(128, 128, window=4, page_size=4, eagle=True)
    prompt = list(range(20, 34))
    r = CachedReq(last_node=tree.root)
    assert tree.admit(r, prompt) == 0
    assert extend_slots(tree, r, 6)
    assert tree.cache_unfinished_req(r, prompt[:6]) == (0, 4)
    own_page = r.kv_slots[4:6].copy()
    other = CachedReq(last_node=tree.root)
    assert tree.admit(other, prompt) == 4
    assert extend_slots(tree, other, len(prompt) + 1 - 4)
    tree.cache_finished_req(other, [*prompt, 900, 901])  # the tree now holds 12 units of this prompt
    tree.check_invariants([r])
    assert extend_slots(tree, r, 6)  # continues its partial page, then a fresh one
    assert tree.cache_unfinished_req(r, prompt[:12]) == (4, 8)
    assert not np.isin(own_page, r.kv_slots).any()  # its duplicate page went back to the pool...
    assert np.isin(own_page, alloc.free_slot_ids()).all()
    assert np.array_equal(r.kv_slots[:8], tree.match_prefix(prompt[:9]).slots)  # ...replaced by the tree's
    assert tree.check_invariants([r])["live_only"] == 4  # positions 8-11: past page_floor(12 - 1) = 8
    tree.release_req(r)
    assert tree.check_invariants()["live_only"] == 0


def test_rematch_after_a_chunk_covers_all_it_inserted_despite_tombstones() -> None:
    """SGLang PR #40681: the re-match in `cache_unfinished_req` must not come back shorter than what
    was inserted (the request's slots there would have been freed as duplicates). A tombstone before the
    request's SWA-locked window and a new suffix shorter than the window: the locked window still counts,
    so the re-match covers everything."""
    tree, alloc = make_swa(64, 64, window=4)
    for seq in (A, A + B, A + B + C):
        tree.insert(seq, alloc.alloc(len(seq)))
    prompt = A + B + C + [9, 10, 11, 12]
    r = CachedReq(last_node=tree.root)
    assert tree.admit(r, prompt) == 8
    assert tree.evict(0, 3) == (0, 3)  # A: outside the window (C + B = 5 >= 4), full-locked only
    assert [n.key.tokens.tolist() for n in tree.iter_nodes() if n.tombstone] == [A]
    assert extend_slots(tree, r, 2)
    assert tree.cache_unfinished_req(r, prompt[:10]) == (8, 10)  # 2 new units < W = 4
    assert r.last_matched_prefix_len == 10
    assert np.array_equal(r.kv_slots[:10], tree.match_prefix(prompt[:10]).slots)
    tree.check_invariants([r])
    tree.release_req(r)
    tree.check_invariants()


def test_touched_path_puts_each_parent_right_behind_its_child_in_both_lists() -> None:
    """After a match, the path is the most recent run of both lists, deepest node first (the SWA list
    skips tombstones), so eviction reaches root-side nodes first."""
    tree, alloc = build_abc(4, "A")
    tree.insert([50, 51], alloc.alloc(2))  # an unrelated, newer node
    path = tree._path(tree.match_prefix(A + B + C).node)
    assert list(tree.full_lru.owners_mru_first())[:3] == path[::-1]
    assert list(tree.swa_lru.owners_mru_first())[:2] == [n for n in path[::-1] if not n.tombstone]
    assert tree.full_lru.lru_where(lambda n: True).key.tokens.tolist() == [50, 51]


def test_evict_subtree_drops_the_branch_and_a_tombstone_parent_left_childless() -> None:
    tree, _alloc = build_abc(4, "A")  # A(3, tombstone) -> B(2) -> C(3)
    b_node = tree.match_prefix(A + B + C).node.parent
    assert tree.evict_subtree(b_node) == 8  # B and C (5), then the tombstone A left without children (3)
    assert tree.num_nodes == 0
    assert tree.check_invariants() == {"free": 64, "tree": 0, "live_only": 0, "swa_free": 64}
