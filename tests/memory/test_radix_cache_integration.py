"""The radix cache frees through the allocator facade: inserts, duplicate frees and evictions keep G1."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cache import RadixCache
from jaxserve.memory import AllocatorFacade, make_allocator


@settings(max_examples=25, deadline=None)
@given(page_size=st.sampled_from([1, 4]), data=st.data())
def test_radix_cache_over_the_facade_keeps_ownership(page_size: int, data) -> None:
    p = page_size
    facade = AllocatorFacade(make_allocator(24, p))
    tree = RadixCache(facade, page_size=p)
    for _ in range(data.draw(st.integers(1, 12))):
        if data.draw(st.booleans()):
            pages = data.draw(st.integers(1, 4))
            tokens = data.draw(st.lists(st.integers(0, 3), min_size=pages * p, max_size=pages * p))
            if facade.available_size() < pages * p:
                tree.evict(pages * p - facade.available_size())
            slots = facade.alloc(pages * p)
            if slots is None:
                continue
            cached = tree.insert(np.array(tokens), slots)
            if cached:
                facade.free(slots[:cached])  # the caller's duplicates of what the tree already had
        else:
            tree.evict(data.draw(st.integers(1, 8)))
        tree.check_invariants()
        assert facade.available_size() + tree.total_size() == 24 * p
    tree.evict(24 * p)
    assert facade.available_size() == 24 * p
