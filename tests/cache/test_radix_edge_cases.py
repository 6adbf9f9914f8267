"""Edge cases of the plain tree (keys under EAGLE and pages, finishing, chunked prefill, splits, locks,
eviction), the worked examples of `cache/README.md`, and the ownership defect of "Where we differ from SGLang"
(SGLang frees a page a chunked EAGLE request still uses; we must not)."""

from __future__ import annotations

import numpy as np
import pytest

from cache import CachedReq, RadixKey
from cache.testing import CheckedAllocator
from tests.cache.radix_sim import admit, decode, extend_slots, finish, make_cache, prefill


def slots_of(cache, tokens) -> list[int]:
    return cache.match_prefix(tokens).slots.tolist()


# ---------------------------------------------------------------- keys under EAGLE and pages
@pytest.mark.parametrize("tokens", [[], [7]])
def test_eagle_empty_and_one_token_keys_match_nothing_insert_nothing(tokens: list[int]) -> None:
    cache, alloc = make_cache(16, eagle=True)
    res = cache.match_prefix(tokens)
    assert res.slots.shape == (0,) and res.node is cache.root
    slots = alloc.alloc(1)
    assert cache.insert(tokens, slots) == 0  # the slot is not stored (R4): the caller frees it
    assert cache.total_size() == 0
    alloc.free(slots)
    cache.check_invariants()


def test_bigram_conversion_is_idempotent_and_never_mutates_the_callers_key() -> None:
    cache, alloc = make_cache(16, eagle=True)
    key = RadixKey.of([1, 2, 3, 4])
    slots = alloc.alloc(3)
    cache.insert(key, slots)
    assert not key.bigram and key.tokens.tolist() == [1, 2, 3, 4]  # deliberate difference: keys are immutable
    assert slots_of(cache, key) == slots.tolist()
    assert (
        slots_of(cache, key.as_bigram()) == slots.tolist()
    )  # already-bigram keys are not re-converted
    assert slots_of(cache, key.as_bigram().as_bigram()) == slots.tolist()


def test_bigram_key_given_to_a_token_tree_is_rejected() -> None:
    cache, _ = make_cache(16)
    with pytest.raises(ValueError, match="bigram"):
        cache.match_prefix(RadixKey.of([1, 2, 3], bigram=True))


def test_eagle_worked_example_r1_to_r5() -> None:
    """[a..e] with slots s0..s4; EAGLE stores 4 bigrams (s0..s3); [a..f] matches 4 (5 without EAGLE)."""
    for eagle, stored, matched in ((False, 5, 5), (True, 4, 4)):
        cache, alloc = make_cache(16, eagle=eagle)
        s = alloc.alloc(5)
        cache.insert([1, 2, 3, 4, 5], s)
        if eagle:
            alloc.free(s[4:])  # R4: not stored, the caller's to free
        assert cache.total_size() == stored
        assert slots_of(cache, [1, 2, 3, 4, 5, 6]) == s[:matched].tolist()
        cache.check_invariants()


@pytest.mark.parametrize(("eagle", "query_len"), [(False, 7), (True, 8)])
def test_page_truncation_in_match(eagle: bool, query_len: int) -> None:
    """P=4: a 7-token query matches at most 4; under EAGLE an 8-token query (7 bigrams) too."""
    cache, alloc = make_cache(64, 4, eagle)
    tokens = list(range(1, 14))
    units = 12
    cache.insert(tokens[: units + eagle], alloc.alloc(units))
    assert len(slots_of(cache, tokens[:query_len])) == 4
    cache.check_invariants()


# ---------------------------------------------------------------- finishing
def run_finish(page_size: int, eagle: bool, num_kv: int) -> tuple[list[int], CheckedAllocator, object]:
    """A request whose prompt has `num_kv` tokens with KV plus one sampled token; finished at once."""
    cache, alloc = make_cache(64, page_size, eagle)
    sim = admit(cache, list(range(1, num_kv + 1)))
    assert prefill(cache, sim)
    sim.outputs.append(999)
    kv = sim.req.kv_slots.copy()
    finish(cache, sim)
    return kv.tolist(), alloc, cache


@pytest.mark.parametrize(
    ("page_size", "eagle", "num_kv", "stored"),
    [(1, True, 5, 4), (4, False, 10, 8), (4, True, 9, 8), (4, True, 8, 4), (4, False, 8, 8)],
)
def test_finish_stores_page_floor_of_kv_len(page_size: int, eagle: bool, num_kv: int, stored: int) -> None:
    """Keep floor((n - eagle) / P) * P slots; free the rest (an EAGLE request at a page multiple drops a whole
    page)."""
    kv, alloc, cache = run_finish(page_size, eagle, num_kv)
    assert cache.total_size() == stored
    tree_slots = np.concatenate([n.value for n in cache.iter_nodes()]).tolist()
    assert sorted(tree_slots) == sorted(kv[:stored])
    assert alloc.available_size() == 64 - stored
    assert cache.check_invariants()


def test_finish_frees_duplicates_inserted_meanwhile() -> None:
    """The "Finishing a request" example: P=1 EAGLE, [a,b,c,d]+[x,y]; admitted with 1 bigram, meanwhile (b,c)
    got cached elsewhere: the request's slot for (b,c) is a duplicate and is freed."""
    a, b, c, d, x, y = 1, 2, 3, 4, 5, 6
    cache, alloc = make_cache(64, eagle=True)
    s_ab = alloc.alloc(1)
    cache.insert([a, b, 77], np.concatenate([s_ab, alloc.alloc(1)]))  # (a,b),(b,77)
    sim = admit(cache, [a, b, c, d])
    assert sim.admitted == 1
    assert extend_slots(cache, sim.req, 3)  # positions 1..3
    other = alloc.alloc(2)
    assert cache.insert([a, b, c], np.concatenate([s_ab, other[:1]])) == 1  # (b,c) from elsewhere
    alloc.free(other[1:])
    decode(cache, sim, x)
    decode(cache, sim, y)  # feeds x: its slot is allocated
    kv = sim.req.kv_slots.copy()
    finish(cache, sim)
    assert slots_of(cache, [a, b, c, d, x, 0]) == [kv[0], other[0], kv[2], kv[3]]
    assert cache.check_invariants() == {
        "free": 64 - 5,
        "tree": 5,
        "live_only": 0,
    }  # (a,b),(b,77),(b,c),(c,d),(d,x)


# ---------------------------------------------------------------- chunked prefill
def test_chunked_eagle_p1_worked_example() -> None:
    """Chunk = 3 over [a..g] under EAGLE, P = 1, then finish with output [x]."""
    prompt = [11, 12, 13, 14, 15, 16, 17]
    cache, _ = make_cache(64, eagle=True)
    sim = admit(cache, prompt)
    assert prefill(cache, sim, 3)
    s = sim.req.kv_slots.tolist()
    assert (sim.req.last_matched_prefix_len, sim.req.prefix_len) == (2, 3)  # s2 is private
    assert slots_of(cache, prompt[:3]) == s[:2]
    assert prefill(cache, sim, 3)
    s = sim.req.kv_slots.tolist()
    assert (sim.req.last_matched_prefix_len, sim.req.prefix_len) == (5, 6)
    assert [n.value.tolist() for n in sim.req.last_node.path_from_root()] == [s[:2], s[2:5]]
    assert prefill(cache, sim, 3)
    sim.outputs.append(99)
    s = sim.req.kv_slots.tolist()
    finish(cache, sim)
    assert slots_of(cache, prompt) == s[:6]
    assert cache.check_invariants() == {"free": 58, "tree": 6, "live_only": 0}


def test_chunked_p4_keeps_the_partial_page_private() -> None:
    """The partial trailing page stays with the request and the next chunk continues it."""
    cache, _ = make_cache(64, 4)
    prompt = list(range(1, 11))
    sim = admit(cache, prompt)
    assert prefill(cache, sim, 6)
    req = sim.req
    assert (req.last_matched_prefix_len, req.prefix_len) == (4, 6)
    assert cache.check_invariants(live_reqs=[req]) == {
        "free_pages": 14,
        "tree_pages": 1,
        "live_only_pages": 1,
    }
    assert prefill(cache, sim, 6)
    assert req.kv_slots[5] + 1 == req.kv_slots[6]  # same page, continued
    assert (req.last_matched_prefix_len, req.prefix_len) == (8, 10)
    cache.check_invariants(live_reqs=[req])
    cache.release_req(req)
    assert cache.check_invariants() == {"free_pages": 14, "tree_pages": 2, "live_only_pages": 0}


@pytest.mark.parametrize("eagle", [False, True])
def test_chunked_request_replaces_duplicates_by_tree_slots(eagle: bool) -> None:
    """Units the tree got from another request meanwhile are freed from the chunked request and its
    kv_slots point at the tree's slots; the returned range says which positions changed."""
    cache, _ = make_cache(64, 1, eagle)
    prompt = list(range(1, 13))
    sim = admit(cache, prompt)
    assert prefill(cache, sim, 4)
    owned = sim.req.last_matched_prefix_len
    other = admit(cache, prompt)
    assert prefill(cache, other)
    other.outputs.append(50)
    finish(cache, other)  # caches the whole prompt with the other request's slots
    tree_slots = slots_of(cache, prompt)
    assert extend_slots(cache, sim.req, 4)
    start, stop = cache.cache_unfinished_req(sim.req, prompt[:8])
    assert (start, stop) == (owned, 8 - eagle)
    assert sim.req.kv_slots[: 8 - eagle].tolist() == tree_slots[: 8 - eagle]
    cache.check_invariants(live_reqs=[sim.req])
    cache.release_req(sim.req)
    cache.check_invariants()


@pytest.mark.parametrize("page_size", [4, 16])
def test_upstream_defect_chunked_eagle_paged_duplicate_page_is_never_freed_while_used(page_size: int) -> None:
    """Request A is chunked mid-page under EAGLE; B caches the same prompt; A's next chunk finds its
    pages duplicated. SGLang frees `kv[len(prefix_indices) - 1 : new]`, which starts inside A's page while
    A's row keeps its first slots: one page both free and live. We free A's whole duplicate pages and
    repoint A."""
    cache, alloc = make_cache(32 * page_size, page_size, eagle=True)
    prompt = list(range(1, 3 * page_size + 2))
    a = admit(cache, prompt)
    assert prefill(cache, a, page_size + 2)  # one page cached, a partial page private
    assert a.req.last_matched_prefix_len == page_size
    b = admit(cache, prompt)
    assert prefill(cache, b)
    b.outputs.append(7)
    finish(cache, b)
    assert extend_slots(cache, a.req, page_size - 1)
    before_free = alloc.available_size()
    start, stop = cache.cache_unfinished_req(a.req, prompt[: 2 * page_size + 1])
    assert (start, stop) == (page_size, 2 * page_size)
    assert alloc.available_size() == before_free + page_size  # exactly A's duplicate page
    assert a.req.kv_slots[: 2 * page_size].tolist() == slots_of(cache, prompt)[: 2 * page_size]
    cache.check_invariants(live_reqs=[a.req])
    assert prefill(cache, a)
    a.outputs.append(8)
    finish(cache, a)
    cache.check_invariants()


# ---------------------------------------------------------------- splits, locks, eviction
def test_split_during_match_keeps_lock_refs_and_accounting() -> None:
    cache, alloc = make_cache(64)
    cache.insert([1, 2, 3, 4, 5], alloc.alloc(5))
    node = cache.match_prefix([1, 2, 3, 4, 5]).node
    cache.inc_lock_ref(node)
    cache.inc_lock_ref(node)
    upper = cache.match_prefix([1, 2, 9]).node
    assert upper.lock_ref == node.lock_ref == 2 and node.parent is upper
    assert (cache.evictable_size, cache.protected_size) == (0, 5)
    cache.dec_lock_ref(node)
    cache.dec_lock_ref(node)
    assert (cache.evictable_size, cache.protected_size) == (5, 0)
    cache.check_invariants()


def test_eviction_is_lru_over_leaves_and_cascades_to_parents() -> None:
    """Least recently used leaf first; a parent left childless goes in the same call; a node
    is freed whole, so the count may exceed the request."""
    cache, alloc = make_cache(64)
    for tokens in ([1, 2, 3], [1, 2, 4, 5], [6, 7]):
        slots = alloc.alloc(len(tokens))
        if num_cached := cache.insert(tokens, slots):
            alloc.free(slots[:num_cached])
    cache.match_prefix([1, 2, 3])
    cache.match_prefix([6, 7])  # LRU order of leaves: [4,5], [3], [6,7]

    def keys() -> set[tuple[int, ...]]:  # without touching anything
        return {tuple(n.key.tokens.tolist()) for n in cache.iter_nodes()}

    assert cache.evict(1) == 2 and keys() == {(1, 2), (3,), (6, 7)}
    assert cache.evict(2) == 3  # [3], then its parent [1,2], a leaf now: over-shoots by one node
    assert keys() == {(6, 7)}
    assert cache.evict(10) == 2 and cache.total_size() == 0
    cache.check_invariants()


def test_eviction_skips_locked_leaves_and_stops_short_when_all_locked() -> None:
    cache, alloc = make_cache(64)
    cache.insert([1, 2, 3], alloc.alloc(3))
    cache.insert([4, 5], alloc.alloc(2))
    locked = cache.match_prefix([1, 2, 3]).node
    cache.inc_lock_ref(locked)
    assert cache.evict(100) == 2  # only [4,5]
    assert cache.total_size() == 3 and cache.evict(1) == 0
    cache.dec_lock_ref(locked)
    assert cache.evict(1) == 3
    cache.check_invariants()


def test_many_touches_keep_the_lazy_heap_bounded() -> None:
    cache, alloc = make_cache(64)
    cache.insert([1, 2], alloc.alloc(2))
    cache.insert([3, 4], alloc.alloc(2))
    for _ in range(5000):
        cache.match_prefix([1, 2])  # each match of a leaf pushes a fresh heap entry
    assert len(cache._lru) <= 2 * cache.num_nodes + 1024 + 1
    for _ in range(5000):
        cache.insert([1, 2], np.array([1, 2]))  # touches; duplicate slots are the tree's own, nothing to free
    assert len(cache._lru) <= 2 * cache.num_nodes + 1024 + 1
    assert cache.evict(1) == 2 and slots_of(cache, [1, 2]) == [1, 2]  # [3,4] was least recently used


# ---------------------------------------------------------------- page validity, extra keys, disabled tree
def test_paged_values_must_be_whole_pages_outside_page_zero() -> None:
    from cache import InvalidSlotsError, PageAlignmentError

    cache, _ = make_cache(64, 4)
    with pytest.raises(InvalidSlotsError):
        cache.insert([1, 2, 3, 4], np.array([0, 1, 2, 3]))  # page 0 is reserved (padding)
    with pytest.raises(PageAlignmentError):
        cache.insert([1, 2, 3, 4], np.array([9, 10, 11, 12]))  # crosses a page boundary
    assert cache.num_nodes == 0


def test_extra_key_requests_do_not_share() -> None:
    cache, _ = make_cache(64)
    sim = admit(cache, [1, 2, 3, 4], extra_key="lora-a")
    assert prefill(cache, sim)
    sim.outputs.append(9)
    finish(cache, sim)
    assert admit(cache, [1, 2, 3, 4], extra_key="lora-b").admitted == 0
    other = admit(cache, [1, 2, 3, 4], extra_key="lora-a")
    assert other.admitted == 3
    cache.check_invariants(live_reqs=[other.req])


def test_disabled_cache_request_ops_free_directly() -> None:
    cache, alloc = make_cache(64, disabled=True)
    sim = admit(cache, [1, 2, 3, 4])
    assert sim.admitted == 0
    assert prefill(cache, sim, 2) and prefill(cache, sim)
    assert cache.check_invariants(live_reqs=[sim.req]) == {"free": 60, "tree": 0, "live_only": 4}
    decode(cache, sim, 5)
    decode(cache, sim, 6)
    finish(cache, sim)
    assert alloc.available_size() == 64 and cache.total_size() == 0
    cache.check_invariants()


def test_release_keeps_tree_slots_and_frees_private_ones() -> None:
    cache, _ = make_cache(64, 4)
    prompt = list(range(1, 11))
    sim = admit(cache, prompt)
    assert prefill(cache, sim, 9)
    req: CachedReq = sim.req
    cache.release_req(req)
    assert req.kv_slots.shape == (0,) and req.last_node is cache.root and req.prefix_len == 0
    assert cache.total_size() == 8 and cache.protected_size == 0
    assert cache.check_invariants() == {"free_pages": 14, "tree_pages": 2, "live_only_pages": 0}


@pytest.mark.parametrize(
    ("eagle", "page_size", "reused"), [(False, 1, 8), (True, 1, 7), (False, 4, 8), (True, 4, 4)]
)
def test_admission_caps(eagle: bool, page_size: int, reused: int) -> None:
    """A fully cached prompt of length L is reused up to L - 1 tokens (L - 2 under EAGLE), floored to
    pages: at least one token is always recomputed (it produces the logits to sample from)."""
    prompt = list(range(1, 10))
    cache, _ = make_cache(64, page_size, eagle)
    cache.insert(prompt[: 8 + eagle], cache.allocator.alloc(8))  # the whole prompt is cached (P-floored)
    sim = admit(cache, prompt)
    assert sim.admitted == reused
    cache.release_req(sim.req)
    cache.check_invariants()
