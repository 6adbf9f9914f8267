"""The persistent page row of a request (`CachedReq.page_ids`, read by `KVCache.page_ids_many` every step)
equals a brute-force rebuild from the request's slots after any sequence of slot changes: appends (decode,
chunked prefill), truncations (retraction's `shrink`), whole-row assignments (the tree re-pointing a prefix
hit or a cached chunk at its own slots) and releases. The SWA
group mapped only from the window's first page equals the full mapping there, and a step built from it
equals one built from the full mapping wherever the window can see."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache import CachedReq, RadixCache
from jaxserve.engine.kv_cache import KVCache
from jaxserve.layers.attention_metadata import SequenceStep, build_attention_metadata
from jaxserve.memory import AllocatorFacade, make_allocator
from tests.engine.test_page_ids_many import tiny_config


def brute_pages(slots: np.ndarray, page_size: int, num_tokens: int) -> np.ndarray:
    """Page ids of the first slot of every page covering `[0, num_tokens)`, from scratch."""
    firsts = np.asarray(slots, np.int64)[:num_tokens:page_size]
    return (firsts // page_size).astype(np.int32)


ops = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(0, 40)),
    st.tuples(st.just("truncate"), st.floats(0, 1)),
    st.tuples(st.just("assign"), st.integers(0, 60)),
    st.tuples(st.just("read"), st.integers(0, 80)),
), max_size=40)


@settings(max_examples=200, deadline=None)
@given(page_size=st.sampled_from([1, 2, 16]), script=ops, seed=st.integers(0, 2**16))
def test_row_equals_brute_force_over_random_ops(page_size: int, script, seed: int) -> None:
    """`CachedReq` alone: after every op, `kv_slots` equals the model list and `page_ids(p, n)` equals the
    rebuild for every n; a view read before an assignment keeps its values."""
    rng = np.random.default_rng(seed)
    req, model = CachedReq(last_node=None), np.zeros(0, np.int64)
    kept: list[tuple[np.ndarray, np.ndarray]] = []  # (view handed out, its values then)
    for op, arg in script:
        if op == "append":
            new = rng.integers(0, 10_000, arg)
            req.append_slots(new)
            model = np.concatenate([model, new])
        elif op == "truncate":
            n = int(arg * model.shape[0])
            req.truncate_slots(n)
            model = model[:n]
        elif op == "assign":
            kept.append((req.kv_slots, model.copy()))
            model = rng.integers(0, 10_000, arg)
            req.kv_slots = model
        else:
            got = req.page_ids(page_size, arg)
            assert got.dtype == np.int32 and not got.flags.writeable
            np.testing.assert_array_equal(got, brute_pages(model, page_size, arg))
        np.testing.assert_array_equal(req.kv_slots, model)
        for n in (0, 1, page_size, model.shape[0], model.shape[0] + page_size):
            np.testing.assert_array_equal(req.page_ids(page_size, n), brute_pages(model, page_size, n))
    for view, values in kept:
        np.testing.assert_array_equal(view, values)
    # the slicing idiom `kv_slots = kv_slots[:n]` truncates in place; a foreign array replaces the row
    req.kv_slots = req.kv_slots[: model.shape[0] // 2]
    np.testing.assert_array_equal(req.kv_slots, model[: model.shape[0] // 2])
    with pytest.raises(ValueError):
        req.kv_slots[:1] = 7  # read-only: only the row's verbs change it
    with pytest.raises(ValueError):
        req.truncate_slots(req.kv_slots.shape[0] + 1)


def tree_kv(page_size: int, hybrid: bool, *, radix: bool) -> KVCache:
    return KVCache(tiny_config(hybrid), num_pages=512 // page_size, page_size=page_size, kv_dtype=jnp.float32,
                   disable_radix_cache=not radix)


engine_ops = st.lists(st.one_of(
    st.tuples(st.just("admit"), st.integers(0, 3), st.integers(2, 40)),
    st.tuples(st.just("chunk"), st.integers(0, 3), st.integers(1, 24)),
    st.tuples(st.just("decode"), st.integers(0, 3), st.integers(1, 5)),
    st.tuples(st.just("shrink"), st.integers(0, 3), st.floats(0, 1)),
    st.tuples(st.just("retract"), st.integers(0, 3), st.just(0)),
    st.tuples(st.just("finish"), st.integers(0, 3), st.just(0)),
), max_size=30)


@settings(max_examples=60, deadline=None)
@given(page_size=st.sampled_from([1, 4]), hybrid=st.booleans(), radix=st.booleans(), script=engine_ops,
       seed=st.integers(0, 2**16))
def test_kv_verbs_keep_the_row_equal_to_a_rebuild(page_size: int, hybrid: bool, radix: bool, script,
                                                  seed: int) -> None:
    """Through `KVCache` and its tree, as the scheduler drives them: admission with prefix hits (prompts
    share stems), chunked prefill cached into the tree, decode growth, shrink, release (retraction) and
    finish. After every op, `page_ids_many` equals the rebuild from each
    live request's slots, and the SWA ids mapped from the window equal the full mapping's tail."""
    rng = np.random.default_rng(seed)
    kv = tree_kv(page_size, hybrid, radix=radix)
    stems = [rng.integers(1, 16, 48).tolist() for _ in range(2)]
    live: dict[int, tuple[CachedReq, list[int]]] = {}  # id -> (request, its tokens with KV so far + next)

    def check() -> None:
        reqs = [r for r, _ in live.values()]
        for extra in (0, page_size, 3):
            stops = [r.kv_slots.shape[0] + extra for r in reqs]
            full, swa = kv.page_ids_many(reqs, stops)
            for r, n, f in zip(reqs, stops, full, strict=True):
                np.testing.assert_array_equal(f, brute_pages(r.kv_slots, page_size, n))
            if hybrid:
                starts = [int(rng.integers(0, n + 1)) for n in stops]
                _, part = kv.page_ids_many(reqs, stops, starts)
                for a, whole, tail in zip(starts, swa, part, strict=True):
                    np.testing.assert_array_equal(tail, whole[kv.swa_first_page(a):])
        kv.check(reqs)

    for op, i, arg in script:
        if op == "admit" and i not in live:
            tokens = stems[i % 2][: int(rng.integers(0, 40))] + rng.integers(1, 16, arg).tolist()
            req = CachedReq(last_node=kv.tree.root)
            kv.tree.admit(req, tokens)
            if not kv.extend(req, req.kv_slots.shape[0], len(tokens)):
                kv.tree.release_req(req)
                continue
            kv.tree.cache_unfinished_req(req, tokens)  # the prefill computed them all
            live[i] = (req, tokens)
        elif i not in live:
            continue
        req, tokens = live[i]
        n = req.kv_slots.shape[0]
        if op == "chunk" or op == "decode":
            new = rng.integers(1, 16, arg).tolist()
            if kv.extend(req, n, n + arg):
                tokens += new
                if op == "chunk":
                    kv.tree.cache_unfinished_req(req, tokens)
        elif op == "shrink":
            keep = max(int(arg * n), req.prefix_len)  # what the request has cached stays
            kv.shrink(req, keep)
            del tokens[keep:]
        elif op == "retract":
            kv.tree.release_req(req)
            del live[i]
        elif op == "finish":
            kv.tree.cache_finished_req(req, [*tokens, 1])
            del live[i]
        check()
    for req, _ in live.values():
        kv.tree.release_req(req)
    kv.check([])


@settings(max_examples=40, deadline=None)
@given(page_size=st.sampled_from([1, 4]), data=st.data())
def test_windowed_swa_metadata_equals_full_where_visible(page_size: int, data) -> None:
    """`build_attention_metadata` with SWA ids from `swa_first_page` on equals the metadata built from the
    full SWA ids with the pages before it zeroed: same swa write slots, same swa page table."""
    num_seqs = data.draw(st.integers(1, 4))
    steps_window, steps_full = [], []
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    for _ in range(num_seqs):
        kv_len = data.draw(st.integers(1, 60))
        n = data.draw(st.integers(1, kv_len))
        pages = -(-kv_len // page_size)
        full = rng.integers(1, 100, pages).astype(np.int32)
        swa = rng.integers(0, 100, pages).astype(np.int32)
        lo = data.draw(st.integers(0, (kv_len - n) // page_size))
        zeroed = swa.copy()
        zeroed[:lo] = 0
        steps_window.append(SequenceStep(n, kv_len, full, swa[lo:], swa_first_page=lo))
        steps_full.append(SequenceStep(n, kv_len, full, zeroed))
    a = build_attention_metadata(steps_window, page_size=page_size, with_swa=True)
    b = build_attention_metadata(steps_full, page_size=page_size, with_swa=True)
    np.testing.assert_array_equal(a.swa_page_table, b.swa_page_table)
    np.testing.assert_array_equal(a.swa_write_slots, b.swa_write_slots)
    np.testing.assert_array_equal(a.page_table, b.page_table)
    with pytest.raises(ValueError, match="swa_first_page"):
        build_attention_metadata([SequenceStep(1, 1, [1], [], swa_first_page=1)], page_size=1, with_swa=True)


def test_window_start_counts_the_query() -> None:
    kv = tree_kv(1, True, radix=False)
    assert kv.sliding_window == 4
    assert [kv.window_start(q) for q in (0, 3, 4, 10)] == [0, 0, 1, 7]
    assert tree_kv(1, False, radix=False).window_start(10) == 0


def test_plain_tree_without_kv_cache() -> None:
    """The row under the bare tree (no `KVCache`): admission hands it the tree's slots by assignment."""
    alloc = AllocatorFacade(make_allocator(64, 1))
    tree = RadixCache(alloc, page_size=1)
    a = CachedReq(last_node=tree.root)
    tree.admit(a, [1, 2, 3, 4])
    a.append_slots(alloc.alloc(4))
    tree.cache_finished_req(a, [1, 2, 3, 4, 5])
    b = CachedReq(last_node=tree.root)
    assert tree.admit(b, [1, 2, 3, 9]) == 3
    np.testing.assert_array_equal(b.page_ids(1, 3), brute_pages(b.kv_slots, 1, 3))
    tree.release_req(b)
    assert b.page_ids(1, 3).shape == (0,)
