"""Hybrid SWA pools: layer routing, sizing by ratio, writes through translated slots, donation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.memory import (
    HybridSlots,
    KVLayoutError,
    SWAAllocatorFacade,
    hybrid_pool_sizes,
    make_hybrid_kv_pool,
    make_swa_allocator,
    read_kv,
    write_kv,
    write_kv_all_layers,
    write_kv_all_layers_donated,
    write_kv_hybrid_donated,
)
from jaxserve.memory import kv_pool as KP

H, D, P = 2, 4, 2
NUM_LAYERS, SWA_LAYERS = 5, (1, 3, 4)


def _pool(dtype=jnp.float32):
    return make_hybrid_kv_pool(SWA_LAYERS, NUM_LAYERS, 6, 3, P, H, D, dtype)


def _kv(seed, shape):
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.normal(size=shape), jnp.float32), jnp.asarray(rng.normal(size=shape), jnp.float32)


def test_layer_map_routes_layers_to_their_group() -> None:
    pool = _pool()
    assert pool.layer_map == (("full", 0), ("swa", 0), ("full", 1), ("swa", 1), ("swa", 2))
    assert pool.full.layer_ids == (0, 2) and pool.swa.layer_ids == (1, 3, 4)
    assert pool.full.data.shape == (2, 7 * P, 2 * H, D) and pool.swa.data.shape == (3, 4 * P, 2 * H, D)
    with pytest.raises(KVLayoutError):
        make_hybrid_kv_pool((), 3, 4, 4, P, H, D)
    with pytest.raises(TypeError):
        pool.group_of(jnp.int32(1))


def test_sizes_follow_the_swa_full_tokens_ratio_formula() -> None:
    # 1 full + 3 SWA layers, ratio 0.5: full = 2500 / (0.5 * 3 + 1) = 1000 tokens, swa = 500
    assert hybrid_pool_sizes(2500, 0.5, 1, 3, 1) == (1000, 500)
    full_pages, swa_pages = hybrid_pool_sizes(2500, 0.5, 1, 3, 16)
    assert (full_pages, swa_pages) == (62, 31)
    assert full_pages * 16 * 1 + swa_pages * 16 * 3 <= 2500  # fits the budget
    with pytest.raises(KVLayoutError):
        hybrid_pool_sizes(2500, 1.5, 1, 3, 1)


def test_writes_go_to_the_translated_slots_of_each_group() -> None:
    alloc = SWAAllocatorFacade(make_swa_allocator(6, 3, P))
    full_slots = alloc.alloc(3)
    slots = HybridSlots(jnp.asarray(full_slots), jnp.asarray(alloc.swa_slots_of(full_slots)))
    pool = _pool()
    k_all, v_all = _kv(0, (NUM_LAYERS, 3, H, D))
    for layer in range(NUM_LAYERS):
        pool = write_kv(pool, layer, slots, k_all[layer], v_all[layer])
    for layer in range(NUM_LAYERS):
        k, v = read_kv(pool, layer, slots)
        assert np.array_equal(np.asarray(k), np.asarray(k_all[layer]))
        assert np.array_equal(np.asarray(v), np.asarray(v_all[layer]))
    swa_data = np.asarray(pool.swa.data)
    assert np.array_equal(swa_data[0, np.asarray(slots.swa), 0::2], np.asarray(k_all[1]))
    touched = np.zeros(swa_data.shape[1], bool)
    touched[np.asarray(slots.swa)] = True
    assert not swa_data[:, ~touched].any()  # nothing written outside the mapped SWA slots
    # the whole-step write gives the same pools
    other = write_kv_all_layers(_pool(), slots, k_all, v_all)
    assert np.array_equal(np.asarray(other.full.data), np.asarray(pool.full.data))
    assert np.array_equal(np.asarray(other.swa.data), np.asarray(swa_data))


def test_hybrid_donated_writes_alias_both_groups() -> None:
    pool = _pool(jnp.bfloat16)
    slots = HybridSlots(jnp.array([2, 3], jnp.int32), jnp.array([4, 5], jnp.int32))
    k, v = _kv(1, (2, H, D))
    old_full, old_swa = pool.full.data, pool.swa.data
    ptrs = (old_full.unsafe_buffer_pointer(), old_swa.unsafe_buffer_pointer())
    pool = write_kv_hybrid_donated(pool, 3, slots, k, v)
    assert old_full.is_deleted() and old_swa.is_deleted()
    k_all, v_all = _kv(2, (NUM_LAYERS, 2, H, D))
    pool = write_kv_all_layers_donated(pool, slots, k_all, v_all)
    assert (pool.full.data.unsafe_buffer_pointer(), pool.swa.data.unsafe_buffer_pointer()) == ptrs


@pytest.mark.xla_optimized
def test_period_scan_over_full_and_swa_layers_writes_in_place() -> None:
    """Alternating layers: scan over (full, swa) pairs, write-then-read both pools; no full-pool copy."""
    pool = make_hybrid_kv_pool((1, 3), 4, 6, 3, P, H, D, jnp.bfloat16)

    def step(pool, slots, k_all, v_all):
        def body(carry, xs):
            full, swa = carry
            i, k_pair, v_pair = xs
            full = KP.write_kv(full, i, slots.full, k_pair[0], v_pair[0])
            swa = KP.write_kv(swa, i, slots.swa, k_pair[1], v_pair[1])
            out = KP.read_kv(full, i, slots.full)[0].sum() + KP.read_kv(swa, i, slots.swa)[1].sum()
            return (full, swa), out

        pairs = lambda x: x.reshape(2, 2, *x.shape[1:])  # layers (0, 1), (2, 3)
        (full, swa), outs = jax.lax.scan(
            body, (pool.full, pool.swa), (jnp.arange(2), pairs(k_all), pairs(v_all))
        )
        return pool.replace(full=full, swa=swa), outs

    slots = HybridSlots(jnp.array([2, 3]), jnp.array([6, 7]))
    k_all, v_all = _kv(3, (4, 2, H, D))
    jitted = jax.jit(step, donate_argnums=0)
    hlo = jitted.lower(pool, slots, k_all, v_all).compile().as_text()
    for shape in (pool.full.data.shape, pool.swa.data.shape):
        dims = "[" + ",".join(map(str, shape)) + "]"
        assert not [ln for ln in hlo.splitlines() if " copy(" in ln and dims in ln.split("=", 1)[1][:40]]
    pool, _ = jitted(pool, slots, k_all, v_all)
    k, _ = read_kv(pool, 3, slots)
    assert np.allclose(np.asarray(k, np.float32), np.asarray(k_all[3].astype(jnp.bfloat16), np.float32))
