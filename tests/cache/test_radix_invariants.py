"""`check_invariants` catches what it claims to: leaks, double ownership, broken accounting and locks."""

from __future__ import annotations

import numpy as np
import pytest

from cache import InvariantError
from tests.cache.radix_sim import admit, extend_slots, make_cache
from tests.cache.swa_sim import make_swa


def setup(page_size: int = 1):
    cache, alloc = make_cache(32 * page_size, page_size)
    cache.insert(list(range(1, 4 * page_size + 1)), alloc.alloc(4 * page_size))
    sim = admit(cache, [*range(1, 2 * page_size + 1), 90, 91, 92])
    assert extend_slots(cache, sim.req, 2)  # computing: private until cached
    cache.check_invariants(live_reqs=[sim.req])
    return cache, alloc, sim.req


@pytest.mark.parametrize("page_size", [1, 4])
def test_leaked_slot_is_reported(page_size: int) -> None:
    cache, alloc, req = setup(page_size)
    alloc.alloc(1)  # owned by nobody
    with pytest.raises(InvariantError, match="leak"):
        cache.check_invariants(live_reqs=[req])


def test_forgotten_live_request_shows_as_a_leak() -> None:
    cache, _, _ = setup()
    with pytest.raises(InvariantError, match="leak"):
        cache.check_invariants()


@pytest.mark.parametrize("page_size", [1, 4])
def test_slot_owned_by_tree_and_request_is_reported(page_size: int) -> None:
    cache, _, req = setup(page_size)
    private = req.kv_slots[req.last_matched_prefix_len :]
    page = (private[0] // page_size) * page_size + np.arange(page_size)
    cache.insert([77] * page_size, page)  # the tree now also "owns" the request's private page
    with pytest.raises(InvariantError, match="owned twice"):
        cache.check_invariants(live_reqs=[req])


def test_broken_accounting_is_reported() -> None:
    cache, _, req = setup()
    cache._evictable_size += 1
    with pytest.raises(InvariantError, match="accounting"):
        cache.check_invariants(live_reqs=[req])


def test_missing_lock_is_reported() -> None:
    cache, _, req = setup()
    cache.dec_lock_ref(req.last_node)  # the request still thinks it holds the lock
    with pytest.raises(InvariantError, match="lock_ref"):
        cache.check_invariants(live_reqs=[req])


def test_request_prefix_not_matching_the_tree_is_reported() -> None:
    cache, _, req = setup()
    req.kv_slots = req.kv_slots[::-1].copy()
    with pytest.raises(InvariantError, match="not the tree's slots"):
        cache.check_invariants(live_reqs=[req])


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("kind", ["radix", "swa"])
def test_pages_cached_under_two_keys_are_reported(kind: str, page_size: int) -> None:
    """One page held by two tree nodes is double ownership inside the tree itself, with nothing missing
    from the pool: only counting each node's pages separately (not as a set) can see it."""
    if kind == "radix":
        tree, alloc = make_cache(16 * page_size, page_size)
    else:
        tree, alloc = make_swa(16 * page_size, 16 * page_size, window=4, page_size=page_size)
    slots = alloc.alloc(2 * page_size)
    tree.insert([5] * (2 * page_size), slots)
    tree.check_invariants()
    tree.insert([6] * (2 * page_size), slots.copy())
    with pytest.raises(InvariantError, match="owned twice"):
        tree.check_invariants()
