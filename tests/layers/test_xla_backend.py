"""The `xla` backend (ragged paged attention walking key blocks) equals the `native` oracle.

Hypothesis draws ragged steps (prefill chunks after cached prefixes, decodes, fresh sequences, trailing
padding tokens and padding sequence rows), with EAGLE tree candidates under a custom mask on some
sequences, and runs both backends on the same pool. Variants fix the static options (page size 1 or 16,
window, sinks, soft-cap, scale, which walk); small key/query blocks make every walk span many blocks.
Every output row is compared, padding rows included (both give padding the same visibility).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxserve.layers.attention_metadata import SequenceStep, build_attention_metadata
from jaxserve.layers.backends import get_backend
from jaxserve.memory.kv_pool import make_kv_pool, write_kv
from tests.layers.pallas_cases import assert_pool_not_copied, tree_rows

HQ, HKV, D = 4, 2, 8
MAX_KEYS = 64  # key indices per sequence the page table addresses (64 pages of 1 or 4 pages of 16)
TOKENS, SEQS = 32, 4
# (page_size, window, sinks, softcap, scale, walk, block_keys, query_block)
VARIANTS = [
    (1, None, False, None, None, "token", 16, 8),
    (1, 5, True, 2.0, None, "query", 16, 8),
    (16, None, True, None, 0.7, "query", 16, 8),
    (16, 20, False, 1.5, None, "token", 16, 8),
    (16, 5, True, None, None, None, None, None),  # default block sizes, walk picked by shape
]


def _step(page_size: int, seqs, trees: bool, rng):
    """Pool with cached prefixes written, metadata, q/k/v for one ragged step of `seqs` [(prefix, new)]."""
    num_pages = SEQS * MAX_KEYS // page_size
    pages = rng.permutation(num_pages) + 1
    pool = make_kv_pool(1, num_pages, page_size, HKV, D, jnp.float32)
    steps, mask_rows, offset = [], [], 0
    for i, (prefix, new) in enumerate(seqs):
        total = prefix + new
        own = pages[offset: offset + MAX_KEYS // page_size]  # whole table row: trailing pages are unused
        offset += len(own)
        if prefix:
            idx = np.arange(prefix)
            pool = write_kv(pool, 0, jnp.asarray(own[idx // page_size] * page_size + idx % page_size),
                            jnp.asarray(rng.randn(prefix, HKV, D), jnp.float32),
                            jnp.asarray(rng.randn(prefix, HKV, D), jnp.float32))
        positions = None
        if trees and i % 2 == 0:
            rows, positions = tree_rows(rng, prefix, new)
        else:
            rows = np.arange(MAX_KEYS)[None, :] <= np.arange(prefix, total)[:, None]
        mask_rows.append(rows)
        steps.append(SequenceStep(new, total, own, positions=positions))
    meta = build_attention_metadata(steps, page_size=page_size, token_buckets=(TOKENS,), seq_buckets=(SEQS,),
                                    page_buckets=(MAX_KEYS // page_size,),
                                    custom_mask=np.concatenate(mask_rows) if trees else None)
    q, k, v = (jnp.asarray(rng.randn(TOKENS, h, D), jnp.float32) for h in (HQ, HKV, HKV))
    return pool, meta, q, k, v


def _native(q, k, v, pool, meta, sinks, window, softcap, scale):
    return get_backend("native")(q, k, v, pool, 0, meta, sliding_window=window, sinks=sinks,
                                 logit_softcap=softcap, scale=scale)


_native = jax.jit(_native, static_argnames=("window", "softcap", "scale"))


def _xla(q, k, v, pool, meta, sinks, window, softcap, scale, walk, block_keys, query_block):
    return get_backend("xla")(q, k, v, pool, 0, meta, sliding_window=window, sinks=sinks,
                              logit_softcap=softcap, scale=scale, walk=walk, block_keys=block_keys,
                              query_block=query_block)


_xla = jax.jit(_xla, static_argnames=("window", "softcap", "scale", "walk", "block_keys", "query_block"))

# (prefix, new): prefixes reach the table's end (MAX_KEYS) and page edges (0, 16, 32, 48) often
_SEQ = st.integers(0, MAX_KEYS - 1).flatmap(
    lambda prefix: st.tuples(st.sampled_from([prefix, prefix - prefix % 16]),
                             st.integers(1, min(12, MAX_KEYS - prefix))))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(variant=st.sampled_from(VARIANTS), trees=st.booleans(), seqs=st.lists(_SEQ, min_size=1, max_size=SEQS),
       seed=st.integers(0, 2**16))
def test_xla_equals_native_on_ragged_steps(variant, trees, seqs, seed):
    page_size, window, use_sinks, softcap, scale, walk, block_keys, query_block = variant
    while sum(n for _, n in seqs) > TOKENS:
        seqs = seqs[:-1]
    rng = np.random.RandomState(seed)
    pool, meta, q, k, v = _step(page_size, seqs, trees, rng)
    sinks = jnp.asarray(rng.randn(HQ), jnp.float32) if use_sinks else None
    want, want_pool = _native(q, k, v, pool, meta, sinks, window, softcap, scale)
    got, got_pool = _xla(q, k, v, pool, meta, sinks, window, softcap, scale, walk, block_keys, query_block)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(got_pool.data), np.asarray(want_pool.data))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float8_e4m3fn])
@pytest.mark.parametrize("walk", ["token", "query"])
def test_xla_equals_native_on_low_precision_pools(dtype, walk):
    rng = np.random.RandomState(7)
    seqs = [(30, 6), (17, 1), (0, 9), (47, 1)]
    num_pages = SEQS * MAX_KEYS // 16
    pool = make_kv_pool(1, num_pages, 16, HKV, D, dtype, fp8_scale=0.05)
    pages = rng.permutation(num_pages) + 1
    steps = []
    for i, (prefix, new) in enumerate(seqs):
        own = pages[4 * i: 4 * i + 4]
        if prefix:
            idx = np.arange(prefix)
            pool = write_kv(pool, 0, jnp.asarray(own[idx // 16] * 16 + idx % 16),
                            jnp.asarray(rng.randn(prefix, HKV, D), jnp.float32),
                            jnp.asarray(rng.randn(prefix, HKV, D), jnp.float32))
        steps.append(SequenceStep(new, prefix + new, own))
    meta = build_attention_metadata(steps, page_size=16, token_buckets=(TOKENS,), seq_buckets=(SEQS,),
                                    page_buckets=(4,))
    compute = jnp.bfloat16 if dtype == jnp.bfloat16 else jnp.float32
    q, k, v = (jnp.asarray(rng.randn(TOKENS, h, D), compute) for h in (HQ, HKV, HKV))
    sinks = jnp.asarray(rng.randn(HQ), jnp.float32)
    want, _ = _native(q, k, v, pool, meta, sinks, 8, None, None)
    got, got_pool = _xla(q, k, v, pool, meta, sinks, 8, None, None, walk, 16, 8)
    assert got.dtype == compute and got_pool.data.dtype == pool.data.dtype
    atol = 3e-2 if dtype == jnp.bfloat16 else 1e-5  # bf16: probabilities are rounded at other maxima
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), atol=atol)


def test_swa_tables_are_read_for_swa_layers():
    """Keys outside the window sit in evicted (page id 0) swa pages; the visible ones are found."""
    rng = np.random.RandomState(3)
    pool = make_kv_pool(1, 12, 2, HKV, D, jnp.float32)
    swa_pages = [0, 0, 7, 9]  # key indices 0-3 left every window and were evicted
    meta = build_attention_metadata([SequenceStep(2, 8, [1, 2, 3, 4], swa_pages)], page_size=2,
                                    with_swa=True)
    idx = np.arange(4, 6)
    pool = write_kv(pool, 0, jnp.asarray(np.asarray(swa_pages)[idx // 2] * 2 + idx % 2),
                    *(jnp.asarray(rng.randn(2, HKV, D), jnp.float32) for _ in "kv"))
    q, k, v = (jnp.asarray(rng.randn(meta.num_tokens, h, D), jnp.float32) for h in (HQ, HKV, HKV))
    outs = [get_backend(name)(q, k, v, pool, 0, meta, use_swa_tables=True, sliding_window=3)[0]
            for name in ("native", "xla")]
    np.testing.assert_allclose(np.asarray(outs[1]), np.asarray(outs[0]), atol=2e-6)


@pytest.mark.xla_optimized
@pytest.mark.parametrize("walk", ["token", "query"])
def test_donated_two_layer_step_never_copies_the_pool(walk):
    """Each layer writes, then its key-block loop reads the new pool: XLA keeps the donated pool in place."""

    rng = np.random.RandomState(5)
    pool = make_kv_pool(2, 32, 4, HKV, D, jnp.bfloat16)
    meta = build_attention_metadata([SequenceStep(6, 20, list(range(1, 6))), SequenceStep(1, 9, [7, 8, 9])],
                                    page_size=4)
    q = jnp.asarray(rng.randn(meta.num_tokens, HQ, D), jnp.bfloat16)

    def two_layers(q, pool, meta):
        x = q
        for layer in range(2):  # layer 1's K/V depend on layer 0's output, as in a model
            kv = x[:, :HKV]
            x, pool = get_backend("xla")(x, kv, kv, pool, layer, meta, walk=walk, block_keys=8, query_block=8)
        return x, pool

    compiled = jax.jit(two_layers, donate_argnums=1).lower(q, pool, meta).compile()
    assert_pool_not_copied(compiled.as_text(), pool)
