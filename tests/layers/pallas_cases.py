"""Random ragged attention steps for comparing a backend with the `native` oracle (Pallas kernel tests).

A case is a pool with each sequence's cached prefix written at shuffled pages, the metadata of one
ragged step (prefill chunks after prefixes, decodes, fresh sequences, trailing padding tokens and padding
sequence rows), and q/k/v; with `trees`, every other sequence verifies a random EAGLE tree under a custom
mask. Shapes are fixed per layout, so hypothesis examples of one variant share one compilation.
"""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st

from jaxserve.layers.attention_metadata import AttentionMetadata, SequenceStep, build_attention_metadata
from jaxserve.layers.backends import get_backend
from jaxserve.memory.kv_pool import KVPool, make_kv_pool, write_kv

MAX_KEYS = 64  # key indices per sequence the page table addresses (the longest context of the bucket)
TOKENS, SEQS = 32, 4


@dataclasses.dataclass(frozen=True)
class Layout:
    """Head layout and pool dtype of a case (`compute` is the dtype of q/k/v)."""

    q_heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    pool_dtype: object = jnp.float32
    compute: object = jnp.float32


def tree_rows(rng: np.random.RandomState, prefix: int, new: int,
              max_keys: int = MAX_KEYS) -> tuple[np.ndarray, np.ndarray]:
    """A random tree of `new` candidates at key indices prefix.. (parent index < own index): the custom
    mask rows `[new, max_keys]` (prefix + ancestors + self) and rope positions (prefix + depth)."""
    parents = [-1] + [int(rng.randint(0, c)) for c in range(1, new)]
    rows = np.zeros((new, max_keys), bool)
    depth = np.zeros(new, np.int32)
    for c in range(new):
        rows[c, :prefix] = True
        node = c
        while node >= 0:
            rows[c, prefix + node] = True
            depth[c] += node != c
            node = parents[node]
    return rows, prefix + depth


Case = tuple[KVPool, AttentionMetadata, jax.Array, jax.Array, jax.Array]


def ragged_case(layout: Layout, page_size: int, seqs: list[tuple[int, int]], trees: bool,
                rng: np.random.RandomState, max_keys: int = MAX_KEYS) -> Case:
    """Pool, metadata and q/k/v for one ragged step of `seqs` [(cached prefix, new tokens)]; each page-table
    row addresses `max_keys` key indices."""
    num_pages = SEQS * max_keys // page_size
    pages = rng.permutation(num_pages) + 1
    pool = make_kv_pool(1, num_pages, page_size, layout.kv_heads, layout.head_dim, layout.pool_dtype,
                        fp8_scale=0.05)
    steps, mask_rows, offset = [], [], 0
    for i, (prefix, new) in enumerate(seqs):
        own = pages[offset: offset + max_keys // page_size]  # whole table row: trailing pages are unused
        offset += len(own)
        if prefix:
            idx = np.arange(prefix)
            kv = [jnp.asarray(rng.randn(prefix, layout.kv_heads, layout.head_dim), layout.compute)
                  for _ in "kv"]
            pool = write_kv(pool, 0, jnp.asarray(own[idx // page_size] * page_size + idx % page_size), *kv)
        positions = None
        if trees and i % 2 == 0:
            rows, positions = tree_rows(rng, prefix, new, max_keys)
        else:
            rows = np.arange(max_keys)[None, :] <= np.arange(prefix, prefix + new)[:, None]
        mask_rows.append(rows)
        steps.append(SequenceStep(new, prefix + new, own, positions=positions))
    meta = build_attention_metadata(steps, page_size=page_size, token_buckets=(TOKENS,), seq_buckets=(SEQS,),
                                    page_buckets=(max_keys // page_size,),
                                    custom_mask=np.concatenate(mask_rows) if trees else None)
    q, k, v = (jnp.asarray(rng.randn(TOKENS, h, layout.head_dim), layout.compute)
               for h in (layout.q_heads, layout.kv_heads, layout.kv_heads))
    return pool, meta, q, k, v


def fit(seqs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Drop trailing sequences until the step's tokens fit the token bucket."""
    while sum(n for _, n in seqs) > TOKENS:
        seqs = seqs[:-1]
    return seqs


def seq_strategy(max_keys: int) -> st.SearchStrategy[tuple[int, int]]:
    """(prefix, new): prefixes reach the table's end (`max_keys`) and multiples of 16 (page edges) often."""
    return st.integers(0, max_keys - 1).flatmap(
        lambda prefix: st.tuples(st.sampled_from([prefix, prefix - prefix % 16]),
                                 st.integers(1, min(12, max_keys - prefix))))


def _run_native(q, k, v, pool, meta, sinks, window, softcap, scale):
    return get_backend("native")(q, k, v, pool, 0, meta, sliding_window=window, sinks=sinks,
                                 logit_softcap=softcap, scale=scale)


run_native = jax.jit(_run_native, static_argnames=("window", "softcap", "scale"))


def assert_pool_not_copied(hlo: str, pool: KVPool) -> None:
    """The compiled program `hlo` (text) holds the donated pool's buffer and never copies it."""
    shape = f"u16[{','.join(map(str, pool.data.shape))}]"
    assert shape in hlo
    copies = [ln for ln in hlo.splitlines() if re.search(r"copy\(", ln) and shape in ln]
    assert not copies, copies[:3]
