"""The native paged-attention backend vs a brute-force per-token numpy reference.

Covers GQA, ragged batches (prefill chunk + decodes + padding), page_size 1 and 4 with shuffled pages,
sliding windows (HF inclusive semantics), sinks, soft-capping, a scale override, a custom tree mask, bf16
pools stored as uint16, the swa tables, and the backend registry.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.layers.attention_metadata import SequenceStep, build_attention_metadata
from jaxserve.layers.backends import available_backends, get_backend, register_backend
from jaxserve.memory.kv_pool import make_kv_pool, write_kv

HQ, HKV, D = 4, 2, 8
NUM_PAGES = 48


def _reference(q, keys, values, positions, key_lists, *, window, sinks, softcap, scale):
    """Per token t: attend over `key_lists[t]` (key indices) of its sequence's dense keys/values."""
    out = np.zeros_like(q, dtype=np.float64)
    for t, (k_all, v_all, visible) in enumerate(zip(keys, values, key_lists, strict=True)):
        visible = [j for j in visible if window is None or positions[t] - j < window]
        for h in range(HQ):
            kv_h = h // (HQ // HKV)
            s = np.array([q[t, h] @ k_all[j, kv_h] for j in visible], np.float64) * scale
            if softcap is not None:
                s = softcap * np.tanh(s / softcap)
            m = max(s.max(), sinks[h]) if sinks is not None else s.max()
            e = np.exp(s - m)
            denom = e.sum() + (np.exp(sinks[h] - m) if sinks is not None else 0.0)
            out[t, h] = (e / denom) @ np.stack([v_all[j, kv_h] for j in visible])
    return out


def _scenario(page_size, rng):
    """Sequence 0: prefill chunk of 6 after 9 cached; sequence 1: decode at 13; sequence 2: decode at 1."""
    prefix, new = [9, 13, 0], [6, 1, 1]
    pages = rng.permutation(NUM_PAGES) + 1
    own = [pages[0:16], pages[16:32], pages[32:48]]
    seqs = []
    for i in range(3):
        n_total = prefix[i] + new[i]
        seqs.append(dict(k=rng.randn(n_total, HKV, D).astype(np.float32),
                         v=rng.randn(n_total, HKV, D).astype(np.float32), prefix=prefix[i], new=new[i],
                         pages=own[i][: -(-n_total // page_size)]))
    return seqs


def _slots(pages, key_idx, page_size):
    return pages[key_idx // page_size] * page_size + key_idx % page_size


def _run(page_size, *, window=None, sinks=None, softcap=None, scale=None, dtype=jnp.float32, seed=0,
         custom=None, token_block=64):
    rng = np.random.RandomState(seed)
    seqs = _scenario(page_size, rng)
    pool = make_kv_pool(1, NUM_PAGES, page_size, HKV, D, dtype)
    for s in seqs:  # cached prefix
        if s["prefix"]:
            idx = np.arange(s["prefix"])
            pool = write_kv(pool, 0, jnp.asarray(_slots(s["pages"], idx, page_size)),
                            jnp.asarray(s["k"][: s["prefix"]]), jnp.asarray(s["v"][: s["prefix"]]))
    steps = [SequenceStep(s["new"], s["prefix"] + s["new"], s["pages"]) for s in seqs]
    num_real = sum(s["new"] for s in seqs)
    meta = build_attention_metadata(steps, page_size=page_size, custom_mask=custom)
    k_new = np.concatenate([s["k"][s["prefix"]:] for s in seqs])
    v_new = np.concatenate([s["v"][s["prefix"]:] for s in seqs])
    pad = meta.num_tokens - num_real
    k_new = np.concatenate([k_new, rng.randn(pad, HKV, D).astype(np.float32)])
    v_new = np.concatenate([v_new, rng.randn(pad, HKV, D).astype(np.float32)])
    q = rng.randn(meta.num_tokens, HQ, D).astype(np.float32)
    fn = jax.jit(lambda q, k, v, pool, meta: get_backend("native")(
        q, k, v, pool, 0, meta, sliding_window=window, sinks=sinks, logit_softcap=softcap, scale=scale,
        token_block=token_block))
    cast = (lambda x: jnp.asarray(x, dtype))
    out, pool = fn(cast(q), cast(k_new), cast(v_new), pool, meta)

    if dtype == jnp.bfloat16:  # the reference sees what the pool stores
        rnd = lambda x: np.asarray(jnp.asarray(x, jnp.bfloat16).astype(jnp.float32))
        q = rnd(q)
        for s in seqs:
            s["k"], s["v"] = rnd(s["k"]), rnd(s["v"])
    keys, values, positions, key_lists = [], [], [], []
    for s in seqs:
        for t in range(s["prefix"], s["prefix"] + s["new"]):
            keys.append(s["k"])
            values.append(s["v"])
            positions.append(t)
            key_lists.append(list(range(t + 1)))
    if custom is not None:
        key_lists = [list(np.flatnonzero(custom[t])) for t in range(num_real)]
    want = _reference(q[:num_real], keys, values, positions, key_lists, window=window, sinks=sinks,
                      softcap=softcap, scale=D ** -0.5 if scale is None else scale)
    return np.asarray(out.astype(jnp.float32))[:num_real], want, pool


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("window", [None, 5])
def test_matches_reference_for_ragged_batch(page_size, window):
    got, want, _ = _run(page_size, window=window)
    np.testing.assert_allclose(got, want, atol=2e-5)


def test_token_blocks_give_the_same_result():
    whole, want, _ = _run(4, window=5, seed=5)
    blocked, _, _ = _run(4, window=5, seed=5, token_block=4)  # 16 padded tokens in 4 blocks
    np.testing.assert_allclose(blocked, want, atol=2e-5)
    np.testing.assert_allclose(blocked, whole, atol=1e-6)


def test_sinks_softcap_and_scale_override():
    sinks = np.array([0.5, -1.0, 2.0, 0.0], np.float32)
    got, want, _ = _run(4, window=3, sinks=sinks, softcap=2.0, scale=0.7, seed=1)
    np.testing.assert_allclose(got, want, atol=2e-5)
    plain, _, _ = _run(4, window=3, softcap=2.0, scale=0.7, seed=1)
    assert np.abs(plain - got).max() > 1e-2  # the sinks change the result


def test_bf16_pool_is_stored_as_uint16_and_read_back():
    got, want, pool = _run(4, window=5, dtype=jnp.bfloat16, seed=2)
    assert pool.data.dtype == jnp.uint16
    np.testing.assert_allclose(got, want, atol=3e-2)


def test_custom_tree_mask_replaces_the_causal_test():
    # sequence 0 holds 9 cached tokens + 6 tree candidates at key indices 9..14 with parents
    # [-1, 0, 0, 1, 2, 3] (index into the candidates); the other two sequences decode normally
    parents = [-1, 0, 0, 1, 2, 3]
    rows = []
    for c in range(6):
        row = np.zeros(16, bool)
        row[:9] = True
        node = c
        while node >= 0:
            row[9 + node] = True
            node = parents[node]
        rows.append(row)
    rows.append(np.arange(16) <= 13)  # sequence 1: decode at key index 13
    rows.append(np.arange(16) <= 0)  # sequence 2: decode at key index 0
    got, want, _ = _run(4, custom=np.stack(rows), seed=3)
    np.testing.assert_allclose(got, want, atol=2e-5)
    causal, _, _ = _run(4, seed=3)
    assert np.abs(causal[:6] - got[:6]).max() > 1e-2  # the tree mask differs from plain causal


def test_swa_tables_are_used_for_swa_layers():
    rng = np.random.RandomState(4)
    page_size, n = 2, 5
    pool = make_kv_pool(1, 8, page_size, HKV, D, jnp.float32)
    meta = build_attention_metadata([SequenceStep(n, n, [3, 1, 2], [6, 0, 5])], page_size=page_size,
                                    with_swa=True)
    k = jnp.asarray(rng.randn(meta.num_tokens, HKV, D), jnp.float32)
    q = jnp.asarray(rng.randn(meta.num_tokens, HQ, D), jnp.float32)
    _, pool = get_backend("native")(q, k, k, pool, 0, meta, use_swa_tables=True, sliding_window=2)
    written = np.asarray(pool.data[0, :, 0::2])
    # key index j lives in swa page [6, 0, 5][j // 2]: slots 12, 13, (0, 1: dropped page), 10
    for j, slot in [(0, 12), (1, 13), (4, 10)]:
        np.testing.assert_array_equal(written[slot], np.asarray(k[j]))


def test_registry_rejects_unknown_and_duplicate_names():
    assert "native" in available_backends()
    with pytest.raises(ValueError, match=r"unknown attention backend 'nope'.*native"):
        get_backend("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_backend("native")(lambda *a, **k: None)
