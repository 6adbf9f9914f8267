"""Reference paged attention in plain JAX/XLA: gather keys through the page table, masked softmax.

Memory is O(token_block * max_kv_len * kv_heads * head_dim) for the gathered keys - a correctness oracle
and CPU path, not a fast kernel. Supports GQA, sliding windows, learned sinks, logit soft-capping, a scale
override and a custom mask (see `jaxserve.layers.attention_metadata` for the visibility rule).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxserve.layers.attention_metadata import AttentionMetadata
from jaxserve.layers.backends import register_backend
from jaxserve.memory.kv_pool import KVPool, read_kv, write_kv

_MASKED = -1e30  # finite, so a row with no visible key gives zeros rather than NaN


def key_slots(page_table: jax.Array, page_size: int) -> jax.Array:
    """`[S, max_pages]` page ids -> `[S, max_pages * page_size]` pool slots, one per key index."""
    num_seqs, max_pages = page_table.shape
    offsets = jnp.arange(page_size, dtype=page_table.dtype)
    return (page_table[:, :, None] * page_size + offsets).reshape(num_seqs, max_pages * page_size)


def write_slots_and_table(meta: AttentionMetadata, pool: KVPool,
                          use_swa_tables: bool) -> tuple[jax.Array, jax.Array]:
    """The step's write slots and page table for this layer's pool (the SWA pair when `use_swa_tables`),
    checked against the pool: ValueError when the metadata lacks the SWA pair or the page sizes differ."""
    slots_new = meta.swa_write_slots if use_swa_tables else meta.write_slots
    table = meta.swa_page_table if use_swa_tables else meta.page_table
    if slots_new is None or table is None:
        raise ValueError("use_swa_tables=True but the metadata has no swa_write_slots/swa_page_table")
    if pool.page_size != meta.page_size:
        raise ValueError(f"KV pool page_size {pool.page_size} != metadata page_size {meta.page_size}")
    return slots_new, table


def visibility_mask(meta: AttentionMetadata, sliding_window: int | None) -> jax.Array:
    """bool `[T, max_kv_len]`: which key indices each query token may attend to."""
    key_idx = jnp.arange(meta.max_kv_len, dtype=jnp.int32)[None, :]
    pos = meta.positions[:, None]
    visible = key_idx < meta.kv_lens[meta.seq_ids][:, None]
    visible &= meta.custom_mask if meta.custom_mask is not None else key_idx <= pos
    if sliding_window is not None:
        visible &= pos - key_idx < sliding_window
    return visible


@register_backend("native")
def paged_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, pool: KVPool, layer: int, meta: AttentionMetadata, *,
    use_swa_tables: bool = False, sliding_window: int | None = None, sinks: jax.Array | None = None,
    logit_softcap: float | None = None, scale: float | None = None, token_block: int = 64,
) -> tuple[jax.Array, KVPool]:
    """Write `k, v [T, kv_heads, D]` into layer `layer` of the pool group `pool`, then attend
    `q [T, q_heads, D]` over the cache (the write comes first: reading the old pool would force a copy).

    `use_swa_tables` selects the swa group's write slots and page table. `sinks [q_heads]` are per-head
    logits added to the softmax denominator only. Scores are `scale * q.k` (default D**-0.5), soft-capped
    as `cap * tanh(s / cap)` before masking; softmax in float32. Returns `(out [T, q_heads, D], new_pool)`
    with `out` in q's dtype. Peak memory: the keys/values of `token_block` tokens, gathered over the
    page table's `max_pages * page_size` key indices (blocks are used when `token_block` divides T).
    """
    num_tokens, num_q_heads, head_dim = q.shape
    slots_new, table = write_slots_and_table(meta, pool, use_swa_tables)

    pool = write_kv(pool, layer, slots_new, k, v)
    token_slots = key_slots(table, meta.page_size)[meta.seq_ids]  # [T, K]
    visible = visibility_mask(meta, sliding_window)  # [T, K]
    scale = head_dim ** -0.5 if scale is None else scale

    def attend(block: tuple[jax.Array, jax.Array, jax.Array]) -> jax.Array:
        q_blk, slots_blk, visible_blk = block
        keys, values = read_kv(pool, layer, slots_blk)  # [B, K, kv_heads, D]
        return _attend(q_blk, keys.astype(q.dtype), values.astype(q.dtype), visible_blk, sinks=sinks,
                       logit_softcap=logit_softcap, scale=scale)

    if num_tokens <= token_block or num_tokens % token_block:
        return attend((q, token_slots, visible)), pool
    # bound the gathered keys to token_block * K rows: blocks run one after another
    num_blocks = num_tokens // token_block
    blocks = (q.reshape(num_blocks, token_block, num_q_heads, head_dim),
              token_slots.reshape(num_blocks, token_block, -1), visible.reshape(num_blocks, token_block, -1))
    return jax.lax.map(attend, blocks).reshape(num_tokens, num_q_heads, head_dim), pool


def _attend(q: jax.Array, keys: jax.Array, values: jax.Array, visible: jax.Array, *,
            sinks: jax.Array | None, logit_softcap: float | None, scale: float) -> jax.Array:
    """Masked softmax attention of `q [B, Hq, D]` over per-token `keys/values [B, K, Hkv, D]`."""
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = keys.shape[2]
    group = num_q_heads // num_kv_heads
    qg = q.reshape(num_tokens, num_kv_heads, group, head_dim)
    scores = jnp.einsum("thgd,tjhd->thgj", qg, keys, preferred_element_type=jnp.float32) * scale
    if logit_softcap is not None:
        scores = logit_softcap * jnp.tanh(scores / logit_softcap)
    visible = visible[:, None, None, :]
    scores = jnp.where(visible, scores, _MASKED)

    row_max = scores.max(axis=-1, keepdims=True)
    if sinks is not None:
        sink = sinks.astype(jnp.float32).reshape(1, num_kv_heads, group, 1)
        row_max = jnp.maximum(row_max, sink)
    weights = jnp.where(visible, jnp.exp(scores - row_max), 0.0)
    denom = weights.sum(axis=-1, keepdims=True)
    if sinks is not None:
        denom = denom + jnp.exp(sink - row_max)
    probs = weights / jnp.where(denom > 0, denom, 1.0)
    out = jnp.einsum("thgj,tjhd->thgd", probs.astype(values.dtype), values,
                     preferred_element_type=jnp.float32)
    return out.reshape(num_tokens, num_q_heads, head_dim).astype(q.dtype)
