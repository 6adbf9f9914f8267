"""`KVCache.page_ids_many` equals `page_ids` request by request (hybrid and plain pools, page sizes 1 and 16,
tombstoned SWA pages read 0), validates like it, and `build_step_input` uses it (one allocator call)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache import CachedReq
from jaxserve.engine.kv_cache import KVCache
from jaxserve.memory import make_allocator, make_swa_allocator
from jaxserve.memory.errors import SlotRangeError, StaleAllocatorStateError
from jaxserve.models.config import FULL, SLIDING, ModelConfig


def tiny_config(hybrid: bool) -> ModelConfig:
    return ModelConfig(architecture="Tiny", model_type="tiny", vocab_size=16, hidden_size=8,
                       intermediate_size=8, num_layers=2, num_heads=1, num_kv_heads=1, head_dim=4,
                       rms_norm_eps=1e-6, layer_types=(SLIDING, FULL) if hybrid else (FULL, FULL),
                       sliding_window=4 if hybrid else None, rope=())


_KV: dict[tuple[bool, int], KVCache] = {}


def fresh_kv(hybrid: bool, page_size: int) -> KVCache:
    """One KVCache per (hybrid, page_size) (pool arrays are built once), with a fresh allocator."""
    key = (hybrid, page_size)
    if key not in _KV:
        _KV[key] = KVCache(tiny_config(hybrid), num_pages=400 if page_size == 1 else 64, page_size=page_size,
                           kv_dtype=jnp.float32, disable_radix_cache=True)
    kv = _KV[key]
    if hybrid:  # drop whatever the last example left allocated (requests here never free their slots)
        kv.allocator.state = make_swa_allocator(kv.num_pages, kv.swa_num_pages, page_size)
    else:
        kv.allocator.state = make_allocator(kv.num_pages, page_size)
    return kv


def grow(kv: KVCache, lengths: list[int]) -> list[CachedReq]:
    """Requests holding `lengths[i]` slots, grown in two interleaved rounds (so pages are not contiguous)."""
    reqs = [CachedReq(last_node=None) for _ in lengths]
    half = [n // 2 for n in lengths]
    assert kv.extend_many([(r, 0, h) for r, h in zip(reqs, half, strict=True) if h > 0])
    assert kv.extend_many([(r, h, n) for r, h, n in zip(reqs, half, lengths, strict=True) if n > h])
    return reqs


def check_equal(kv: KVCache, reqs: list[CachedReq], num_tokens: list[int]) -> tuple[list, list | None]:
    full, swa = kv.page_ids_many(reqs, num_tokens)
    assert len(full) == len(reqs)
    assert (swa is None) == (not kv.hybrid)
    for i, (req, n) in enumerate(zip(reqs, num_tokens, strict=True)):
        one_full, one_swa = kv.page_ids(req, n)
        assert full[i].dtype == np.int32 and np.array_equal(full[i], one_full)
        if kv.hybrid:
            assert swa[i].dtype == np.int32 and np.array_equal(swa[i], one_swa)
    return full, swa


@settings(max_examples=40, deadline=None)
@given(hybrid=st.booleans(), page_size=st.sampled_from([1, 16]), data=st.data())
def test_page_ids_many_equals_page_ids(hybrid: bool, page_size: int, data) -> None:
    kv = fresh_kv(hybrid, page_size)
    max_len = 60 if page_size == 1 else 8 * page_size
    lengths = data.draw(st.lists(st.integers(1, max_len), min_size=1, max_size=6))
    reqs = grow(kv, lengths)
    tombstoned: set[int] = set()
    if hybrid:  # free the SWA side of some whole pages (a sliding-window tombstone): their SWA ids read 0
        for req in reqs:
            pages = np.unique(req.kv_slots // page_size)
            for page in data.draw(st.lists(st.sampled_from(pages.tolist()), max_size=3, unique=True)):
                kv.allocator.free_swa(np.arange(page * page_size, (page + 1) * page_size))
                tombstoned.add(page)
    num_tokens = [data.draw(st.integers(1, n + page_size)) for n in lengths]  # past the end: truncated
    full, swa = check_equal(kv, reqs, num_tokens)
    for i, (req, n) in enumerate(zip(reqs, num_tokens, strict=True)):
        expect = req.kv_slots[:n:page_size] // page_size
        assert full[i].tolist() == expect.tolist()  # independent of page_ids
        if hybrid:
            dead = np.isin(expect, list(tombstoned))
            assert (swa[i][dead] == 0).all() and (swa[i][~dead] > 0).all()
    if hybrid:  # live SWA pages are distinct across requests (one mapping, no aliasing)
        live = np.concatenate(swa)
        live = live[live > 0]
        full_of_live = np.concatenate(full)[np.concatenate(swa) > 0]
        assert np.unique(live).size == np.unique(full_of_live).size


@pytest.mark.parametrize("hybrid", [False, True])
def test_page_ids_many_edge_cases(hybrid: bool) -> None:
    kv = fresh_kv(hybrid, 16)
    assert kv.page_ids_many([], []) == ([], [] if hybrid else None)
    reqs = grow(kv, [20, 33])
    with pytest.raises(ValueError, match="2 requests but 1 token counts"):
        kv.page_ids_many(reqs, [5])
    full, swa = kv.page_ids_many(reqs, [1, 33])
    assert [f.size for f in full] == [1, 3]
    with pytest.raises(ValueError):  # read-only views of one shared buffer
        full[0][0] = 7
    if hybrid:
        with pytest.raises(ValueError):
            swa[1][0] = 7


def test_page_ids_many_validates_like_page_ids() -> None:
    kv = fresh_kv(True, 1)
    reqs = grow(kv, [4, 5])
    bad = CachedReq(last_node=None, kv_slots=np.array([3, 10_000]))
    for call in (lambda: kv.page_ids(bad, 2), lambda: kv.page_ids_many([reqs[0], bad], [4, 2])):
        with pytest.raises(SlotRangeError):
            call()
    saved = kv.allocator.state
    kv.allocator.free(reqs[1].kv_slots)  # a free after the backup: the backup is stale
    kv.allocator._state = saved  # bypass the facade's own restore check to reach swa_slots_of's
    for call in (lambda: kv.page_ids(reqs[0], 4), lambda: kv.page_ids_many(reqs[:1], [4])):
        with pytest.raises(StaleAllocatorStateError):
            call()


@pytest.mark.parametrize("page_size", [1, 16])
def test_build_step_input_maps_all_requests_in_one_allocator_call(page_size: int, monkeypatch) -> None:
    from jaxserve.engine.request import make_request
    from jaxserve.engine.step_input import Buckets, ScheduledSeq, build_step_input
    from jaxserve.sampling import SamplingParams

    kv = fresh_kv(True, page_size)
    params = SamplingParams(temperature=0.0, max_new_tokens=4)
    lengths = [5, 40, 17]
    reqs = [make_request(f"r{i}", np.arange(n) % 16, params, tree_root=kv.tree.root, seed=i)
            for i, n in enumerate(lengths)]
    for req, n in zip(reqs, lengths, strict=True):
        assert kv.extend(req.cached, 0, n)
    kv.allocator.free_swa(req.cached.kv_slots[:page_size])  # tombstone the last request's first page
    calls = []
    real = kv.allocator.swa_slots_of
    monkeypatch.setattr(kv.allocator, "swa_slots_of", lambda slots: calls.append(1) or real(slots))
    seqs = [ScheduledSeq(req, 0, n, samples=False) for req, n in zip(reqs, lengths, strict=True)]
    inp = build_step_input(seqs, kv, Buckets((64, 128), (4,), (64,)))
    assert len(calls) == 1
    meta = inp.meta
    for s, (req, n) in enumerate(zip(reqs, lengths, strict=True)):
        full, swa = kv.page_ids(req.cached, n)
        assert np.array_equal(meta.page_table[s, : full.size], full)
        assert np.array_equal(meta.swa_page_table[s, : swa.size], swa)
    assert meta.swa_page_table[2, 0] == 0 and (meta.swa_page_table[:2, 0] > 0).all()
    all_slots = np.concatenate([r.cached.kv_slots for r in reqs])
    assert meta.write_slots[: sum(lengths)].tolist() == all_slots.tolist()
