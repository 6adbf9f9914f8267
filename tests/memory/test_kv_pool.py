"""KV pools: layout, dtype round trips, donation/aliasing, write-then-read in one donated step, bad input."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.memory import (
    KVLayoutError,
    make_kv_pool,
    move_kv_donated,
    read_kv,
    read_kv_jit,
    write_kv,
    write_kv_all_layers_donated,
    write_kv_donated,
)
from jaxserve.memory.kv_pool import paged_view

L, PAGES, P, H, D = 2, 7, 4, 2, 8  # 32 slots


def _kv(seed: int, shape: tuple[int, ...], dtype=jnp.float32) -> tuple[jax.Array, jax.Array]:
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.normal(size=shape), dtype), jnp.asarray(rng.normal(size=shape), dtype)


def test_layout_interleaves_k_and_v_and_reserves_page_zero() -> None:
    pool = make_kv_pool(L, PAGES, P, H, D, jnp.float32)
    assert pool.data.shape == (L, (PAGES + 1) * P, 2 * H, D) and pool.num_pages == PAGES
    k, v = _kv(0, (3, H, D))
    pool = write_kv(pool, 1, jnp.array([4, 9, 31]), k, v)
    data = np.asarray(pool.data)
    assert np.array_equal(data[1, [4, 9, 31], 0::2], np.asarray(k))
    assert np.array_equal(data[1, [4, 9, 31], 1::2], np.asarray(v))
    paged = np.asarray(paged_view(pool, 1))  # the RPA kernel's per-layer view
    assert paged.shape == (PAGES + 1, P, 2 * H, D)
    assert np.array_equal(paged[2, 1, 0::2], np.asarray(k[1]))
    assert not data[0].any() and not data[1, :4].any()


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16])
def test_round_trip_is_exact_for_values_representable_in_the_dtype(dtype) -> None:
    pool = make_kv_pool(L, PAGES, P, H, D, dtype)
    assert pool.data.dtype == {jnp.bfloat16: jnp.uint16}.get(dtype, dtype)
    k, v = _kv(1, (5, H, D), dtype)
    slots = jnp.array([5, 6, 12, 20, 30])
    pool = write_kv(pool, 0, slots, k, v)
    k2, v2 = read_kv(pool, 0, slots)
    assert k2.dtype == dtype
    assert np.array_equal(np.asarray(k2), np.asarray(k)) and np.array_equal(np.asarray(v2), np.asarray(v))
    # the other layer and other slots stay untouched
    k3, _ = read_kv(pool, 1, slots)
    assert not np.asarray(k3, np.float32).any()


def test_fp8_round_trip_within_quantization_tolerance() -> None:
    scale = 0.05
    pool = make_kv_pool(L, PAGES, P, H, D, jnp.float8_e4m3fn, fp8_scale=scale)
    assert pool.data.dtype == jnp.uint8 and pool.output_dtype == jnp.float32
    k, v = _kv(2, (6, H, D))
    slots = jnp.arange(6) + 8
    k2, v2 = read_kv(write_kv(pool, 1, slots, k, v), 1, slots)
    # e4m3: 3 mantissa bits -> relative error <= 2^-4, plus the subnormal step (2^-9) times the scale
    for a, b in ((k, k2), (v, v2)):
        err = np.abs(np.asarray(b) - np.asarray(a))
        assert (err <= np.abs(np.asarray(a)) * 2**-4 + scale * 2**-9).all()
    bf16_pool = make_kv_pool(L, PAGES, P, H, D, jnp.float8_e4m3fn, fp8_scale=scale, read_dtype=jnp.bfloat16)
    k4, _ = read_kv(write_kv(bf16_pool, 0, slots, k, v), 0, slots)
    assert k4.dtype == jnp.bfloat16 and np.allclose(np.asarray(k4, np.float32), np.asarray(k2), rtol=2**-7)
    big = jnp.full((1, H, D), 1e6)
    k3, _ = read_kv(write_kv(pool, 1, jnp.array([4]), big, big), 1, jnp.array([4]))
    assert np.allclose(np.asarray(k3), 448 * scale)  # saturates at the largest finite fp8, never inf/nan


def test_donated_write_deletes_input_and_aliases_output() -> None:
    pool = make_kv_pool(L, PAGES, P, H, D, jnp.bfloat16)
    k, v = _kv(3, (4, H, D), jnp.bfloat16)
    slots = jnp.array([4, 5, 6, 7], jnp.int32)
    for layer in (0, 1, 0):
        before = pool.data
        ptr = before.unsafe_buffer_pointer()
        pool = write_kv_donated(pool, jnp.int32(layer), slots, k, v)
        assert before.is_deleted()
        assert pool.data.unsafe_buffer_pointer() == ptr
    before = pool.data
    ptr = before.unsafe_buffer_pointer()
    k_all, v_all = _kv(4, (L, 4, H, D), jnp.bfloat16)
    pool = write_kv_all_layers_donated(pool, slots, k_all, v_all)
    assert before.is_deleted() and pool.data.unsafe_buffer_pointer() == ptr
    k2, v2 = read_kv_jit(pool, 1, slots)
    assert np.array_equal(np.asarray(k2), np.asarray(k_all[1]))
    assert np.array_equal(np.asarray(v2), np.asarray(v_all[1]))


@pytest.mark.xla_optimized
def test_bf16_write_never_materialises_a_float_copy_of_the_pool() -> None:
    """The compiled donated write has no f32/bf16 array of the pool's shape (the CPU upcast pitfall)."""
    pool = make_kv_pool(L, PAGES, P, H, D, jnp.bfloat16)
    k, v = _kv(5, (4, H, D), jnp.bfloat16)
    hlo = write_kv_donated.lower(pool, jnp.int32(0), jnp.arange(4) + 4, k, v).compile().as_text()
    dims = ",".join(map(str, pool.data.shape))
    assert f"f32[{dims}]" not in hlo and f"bf16[{dims}]" not in hlo
    assert "input_output_alias" in hlo


def _step(pool, slots, k_all, v_all, read_slots):
    """A fake model step: per layer (lax.scan), write this step's K/V, then read through the new pool."""

    def layer_body(pool, xs):
        layer, k, v = xs
        pool = write_kv(pool, layer, slots, k, v)  # write first ...
        k_r, v_r = read_kv(pool, layer, read_slots)  # ... then read: XLA updates in place
        return pool, k_r.astype(jnp.float32).sum() + v_r.astype(jnp.float32).sum()

    return jax.lax.scan(layer_body, pool, (jnp.arange(pool.num_layers), k_all, v_all))


def full_pool_copies(hlo: str, shape: tuple[int, ...]) -> int:
    """Number of HLO `copy` instructions producing an array of the pool's full shape."""
    dims = "[" + ",".join(map(str, shape)) + "]"
    return sum(1 for line in hlo.splitlines() if " copy(" in line and dims in line.split("=", 1)[1][:40])


@pytest.mark.xla_optimized
def test_write_then_read_inside_one_donated_step() -> None:
    step = jax.jit(_step, donate_argnums=0)
    pool = make_kv_pool(L, PAGES, P, H, D, jnp.bfloat16)
    k0, v0 = _kv(6, (L, 3, H, D), jnp.bfloat16)
    pool, _ = step(pool, jnp.array([4, 5, 6]), k0, v0, jnp.array([4, 5, 6, 0]))
    k1, v1 = _kv(7, (L, 2, H, D), jnp.bfloat16)
    args = (jnp.array([7, 8]), k1, v1, jnp.array([4, 5, 6, 7, 8]))
    assert full_pool_copies(step.lower(pool, *args).compile().as_text(), pool.data.shape) == 0
    ptr = pool.data.unsafe_buffer_pointer()
    old = pool.data
    pool, sums = step(pool, *args)
    assert old.is_deleted() and pool.data.unsafe_buffer_pointer() == ptr
    f32 = lambda x: np.asarray(x, np.float32)
    expect = [f32(k0[i]).sum() + f32(v0[i]).sum() + f32(k1[i]).sum() + f32(v1[i]).sum() for i in range(L)]
    assert np.allclose(np.asarray(sums), expect, rtol=1e-5, atol=1e-4)


@pytest.mark.xla_optimized
def test_move_kv_copies_every_layer_in_place() -> None:
    pool = make_kv_pool(L, PAGES, P, H, D, jnp.bfloat16)
    k_all, v_all = _kv(10, (L, 3, H, D), jnp.bfloat16)
    src, dst = jnp.array([4, 5, 6]), jnp.array([20, 9, 13])
    pool = write_kv_all_layers_donated(pool, src, k_all, v_all)
    hlo = move_kv_donated.lower(pool, src, dst).compile().as_text()
    assert full_pool_copies(hlo, pool.data.shape) == 0
    old, ptr = pool.data, pool.data.unsafe_buffer_pointer()
    pool = move_kv_donated(pool, src, dst)
    assert old.is_deleted() and pool.data.unsafe_buffer_pointer() == ptr
    for layer in range(L):
        k, v = read_kv(pool, layer, dst)
        assert np.array_equal(np.asarray(k), np.asarray(k_all[layer]))
        assert np.array_equal(np.asarray(v), np.asarray(v_all[layer]))
    with pytest.raises(KVLayoutError):
        move_kv_donated(pool, src, dst[:2])


def test_padding_tokens_write_only_the_padding_slot() -> None:
    pool = make_kv_pool(L, PAGES, P, H, D, jnp.float32)
    k, v = _kv(8, (4, H, D))
    pool = write_kv(pool, 0, jnp.array([9, 0, 0, 0]), k, v)  # one real token, three padding
    data = np.asarray(pool.data)
    assert np.array_equal(data[0, 9, 0::2], np.asarray(k[0]))
    assert data[0, 1:9].sum() == 0 and data[0, 10:].sum() == 0


def test_bad_writes_raise_clear_errors() -> None:
    pool = make_kv_pool(L, PAGES, P, H, D, jnp.float32)
    k, v = _kv(9, (3, H, D))
    slots = jnp.array([4, 5, 6])
    with pytest.raises(KVLayoutError, match="shape"):
        write_kv(pool, 0, slots, k[:, :1], v)
    with pytest.raises(KVLayoutError, match="shape"):
        write_kv(pool, 0, slots[:2], k, v)
    with pytest.raises(KVLayoutError, match="floating"):
        write_kv(pool, 0, slots, k.astype(jnp.int32), v)
    with pytest.raises(KVLayoutError, match="integer"):
        write_kv(pool, 0, slots.astype(jnp.float32), k, v)
    with pytest.raises(KVLayoutError, match="unsupported"):
        make_kv_pool(L, PAGES, P, H, D, jnp.int8)
    with pytest.raises(KVLayoutError, match=">= 1"):
        make_kv_pool(L, 0, P, H, D)
