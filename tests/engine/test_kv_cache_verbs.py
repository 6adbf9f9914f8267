"""`KVCache`'s memory verbs (`extend_many`, `shrink`, `reserve`) against a brute-force model of slot
ownership: every slot is free or owned by exactly one request, page-granular, whatever the call order."""

from __future__ import annotations

import jax.numpy as jnp
from hypothesis import given, settings
from hypothesis import strategies as st

from cache import CachedReq
from jaxserve.engine.kv_cache import KVCache
from jaxserve.memory import make_allocator
from tests.engine.test_page_ids_many import tiny_config

_KV: dict[int, KVCache] = {}


def fresh_kv(page_size: int) -> KVCache:
    if page_size not in _KV:
        _KV[page_size] = KVCache(tiny_config(False), num_pages=48, page_size=page_size, kv_dtype=jnp.float32,
                                 disable_radix_cache=True)
    kv = _KV[page_size]
    kv.allocator.state = make_allocator(kv.num_pages, page_size)
    return kv


def check_ownership(kv: KVCache, reqs: list[CachedReq], lengths: list[int]) -> None:
    """The model: request i holds exactly `lengths[i]` slots; owned pages are disjoint, and the allocator's
    free count is every page no request touches."""
    p = kv.page_size
    pages = [set((r.kv_slots // p).tolist()) for r in reqs]
    assert [r.kv_slots.shape[0] for r in reqs] == lengths
    assert sum(len(s) for s in pages) == len(set().union(*pages))  # no page held twice
    assert all(len(s) == -(-n // p) for s, n in zip(pages, lengths, strict=True))  # whole pages, no gaps
    assert kv.available_slots() == kv.num_slots - p * sum(len(s) for s in pages)


ops = st.lists(st.tuples(st.sampled_from(["extend", "shrink"]), st.integers(0, 3),
                         st.integers(0, 40)), min_size=1, max_size=30)


@settings(max_examples=60, deadline=None)
@given(page_size=st.sampled_from([1, 4]), script=ops)
def test_verbs_keep_every_slot_owned_once(page_size, script):
    kv = fresh_kv(page_size)
    reqs = [CachedReq(last_node=None) for _ in range(4)]
    lengths = [0] * 4
    for op, i, n in script:
        if op == "extend" and n > 0:
            if kv.extend_many([(reqs[i], lengths[i], lengths[i] + n)]):
                lengths[i] += n
        elif op == "shrink":
            keep = min(n, lengths[i])
            kv.shrink(reqs[i], keep)
            lengths[i] = keep
        check_ownership(kv, reqs, lengths)
    for req in reqs:
        kv.shrink(req, 0)
    assert kv.available_slots() == kv.num_slots


def test_shrink_keeps_the_partial_last_page():
    kv = fresh_kv(4)
    req = CachedReq(last_node=None)
    assert kv.extend_many([(req, 0, 10)])  # 3 pages
    kv.shrink(req, 5)  # positions 0..4: pages 0 and 1 kept, page 2 freed
    assert req.kv_slots.shape[0] == 5 and kv.available_slots() == kv.num_slots - 8
    assert kv.extend_many([(req, 5, 8)])  # continues inside its own page: no new page
    assert kv.available_slots() == kv.num_slots - 8


def test_reserve_says_whether_the_slots_are_free():
    kv = fresh_kv(1)
    assert kv.reserve(kv.num_slots) and not kv.reserve(kv.num_slots + 1)
