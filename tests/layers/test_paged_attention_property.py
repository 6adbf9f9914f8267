"""Property: for random ragged batches (prefill chunks and decodes mixed, shuffled pages, windows, sinks),
the native backend equals a brute-force per-token attention over dense per-sequence K/V."""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxserve.layers.attention_metadata import SequenceStep, build_attention_metadata
from jaxserve.layers.backends import get_backend
from jaxserve.memory.kv_pool import make_kv_pool, write_kv

HQ, HKV, D = 4, 2, 8
NUM_PAGES = 4 * 32
BUCKETS = dict(token_buckets=(32,), seq_buckets=(4,), page_buckets=(32,))  # up to 32 keys of 1-slot pages


@jax.jit
def _write(pool, slots, k, v):
    return write_kv(pool, 0, slots, k, v)


def _attend(q, k, v, pool, meta, window, sinks):
    return get_backend("native")(q, k, v, pool, 0, meta, sliding_window=window, sinks=sinks)


_attend_jit = jax.jit(_attend, static_argnames=("window",))


def _brute_force(q, k_all, v_all, p, window, sinks):
    """One query token at position p over keys 0..p of its sequence."""
    keys = [j for j in range(p + 1) if window is None or p - j < window]
    out = np.zeros((HQ, D))
    for h in range(HQ):
        s = np.array([q[h] @ k_all[j, h // (HQ // HKV)] for j in keys]) * D ** -0.5
        m = s.max() if sinks is None else max(s.max(), sinks[h])
        e = np.exp(s - m)
        denom = e.sum() + (0.0 if sinks is None else np.exp(sinks[h] - m))
        out[h] = (e / denom) @ np.stack([v_all[j, h // (HQ // HKV)] for j in keys])
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(page_size=st.sampled_from([1, 4]), window=st.sampled_from([None, 3]), use_sinks=st.booleans(),
       seqs=st.lists(st.tuples(st.integers(0, 24), st.integers(1, 8)), min_size=1, max_size=4),
       seed=st.integers(0, 2**16))
def test_native_backend_equals_brute_force(page_size, window, use_sinks, seqs, seed):
    if sum(n for _, n in seqs) > 32:
        seqs = seqs[:1]
    rng = np.random.RandomState(seed)
    pages = rng.permutation(NUM_PAGES) + 1
    pool = make_kv_pool(1, NUM_PAGES, page_size, HKV, D, jnp.float32)
    steps, data, offset = [], [], 0
    for prefix, new in seqs:
        total = prefix + new
        own = pages[offset: offset + -(-total // page_size)]
        offset += len(own)
        k_all, v_all = rng.randn(total, HKV, D), rng.randn(total, HKV, D)
        if prefix:
            idx = np.arange(prefix)
            pool = _write(pool, jnp.asarray(own[idx // page_size] * page_size + idx % page_size, jnp.int32),
                          jnp.asarray(k_all[:prefix], jnp.float32), jnp.asarray(v_all[:prefix], jnp.float32))
        steps.append(SequenceStep(new, total, own))
        data.append((prefix, new, k_all, v_all))
    meta = build_attention_metadata(steps, page_size=page_size, **BUCKETS)
    num_tokens = meta.num_tokens
    k_new = np.zeros((num_tokens, HKV, D))
    v_new = np.zeros((num_tokens, HKV, D))
    t = 0
    for prefix, new, k_all, v_all in data:
        k_new[t: t + new], v_new[t: t + new] = k_all[prefix:], v_all[prefix:]
        t += new
    q = rng.randn(num_tokens, HQ, D)
    sinks = rng.randn(HQ).astype(np.float32) if use_sinks else None
    out, _ = _attend_jit(*(jnp.asarray(x, jnp.float32) for x in (q, k_new, v_new)), pool, meta, window,
                         None if sinks is None else jnp.asarray(sinks))
    out = np.asarray(out)
    t = 0
    for prefix, new, k_all, v_all in data:
        for i in range(new):
            want = _brute_force(q[t], k_all, v_all, prefix + i, window, sinks)
            np.testing.assert_allclose(out[t], want, atol=3e-5)
            t += 1
