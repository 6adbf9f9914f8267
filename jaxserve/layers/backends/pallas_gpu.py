"""Ragged paged attention as a Pallas GPU (Triton) kernel: backend `pallas_gpu`.

One `pallas_call` attends a whole ragged step. The tokens are cut into query blocks of one sequence each
(`query_blocks`); program `(b, h, s)` takes query block `b`, KV head `h` (its G query heads stacked as
`G * bq` rows, G padded to a power of two) and split `s` of the block's key blocks. A key block is
`block_keys` key indices: the program looks their pages up in the page table and loads K and V straight
from the pool by slot (no gathered copy of the context), scores them with one matmul, and folds them into
an online softmax in float32. Split-K: decode-like steps spread a long context over `kv_splits` programs
per (block, head); each writes its partial output with its running max and denominator, and the splits
are merged by log-sum-exp afterwards, where the sink is added once.

Visibility, sinks, soft-cap and scale are exactly `native`'s (see `jaxserve.layers.attention_metadata`),
the custom (tree) mask included. Triton needs power-of-two block sizes: `page_size` and `head_dim` must be
powers of two (the rows and key blocks are padded to them). On a machine without a GPU the kernel runs in
Pallas's interpret mode, which is what the CPU tests exercise.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltr

from jaxserve.layers.attention_metadata import AttentionMetadata
from jaxserve.layers.backends import register_backend
from jaxserve.layers.backends.native import write_slots_and_table
from jaxserve.layers.backends.pallas_tpu import to_compute
from jaxserve.layers.backends.query_blocks import QueryBlocks, pick_block_tokens, plan_query_blocks
from jaxserve.memory.kv_pool import KVPool, write_kv

_MASKED = -1e30  # finite, so a fully masked block leaves the running max finite and its weights at 0
BLOCK_KEYS = 64  # key indices per key block (a power of two, at least 16)
MIN_ROWS = 16  # the smallest matmul side Triton accepts
MAX_ROWS = 128  # default cap on padded G * block_tokens (64 for head_dim > 128)
MAX_KV_SPLITS = 16
DECODE_TOKENS_PER_SEQ = 8  # steps with T <= this * S split long contexts across programs


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@register_backend("pallas_gpu")
def ragged_paged_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, pool: KVPool, layer: int, meta: AttentionMetadata, *,
    use_swa_tables: bool = False, sliding_window: int | None = None, sinks: jax.Array | None = None,
    logit_softcap: float | None = None, scale: float | None = None, block_keys: int | None = None,
    block_tokens: int | None = None, kv_splits: int | None = None, interpret: bool | None = None,
) -> tuple[jax.Array, KVPool]:
    """Same contract as `native.paged_attention`: write `k, v [T, kv_heads, D]` into layer `layer`, then
    attend `q [T, q_heads, D]`; returns `(out [T, q_heads, D] in q's dtype, new_pool)`.

    `block_keys`: key indices per key block (a power of two >= 16, default `BLOCK_KEYS`).
    `block_tokens`: tokens per query block (a power of two; default about T / S, enough for 16 rows and
    at most `MAX_ROWS`).
    `kv_splits`: programs sharing one block's key blocks (default: up to `MAX_KV_SPLITS` on decode-like
    steps, by context length; 1 otherwise). `interpret`: Pallas interpret mode (default: when not on a GPU).
    ValueError when `page_size` or `head_dim` is not a power of two.
    """
    num_tokens, num_q_heads, head_dim = q.shape
    page_size = meta.page_size
    if page_size != _pow2(page_size) or head_dim != _pow2(head_dim):
        raise ValueError(f"pallas_gpu needs power-of-two page_size and head_dim, got {page_size}, {head_dim}")
    slots_new, table = write_slots_and_table(meta, pool, use_swa_tables)
    pool = write_kv(pool, layer, slots_new, k, v)  # write first: the kernel reads the new pool
    meta, table = jax.tree.map(jnp.asarray, (meta, table))
    padded_group = _pow2(num_q_heads // pool.num_kv_heads)
    bk = max(MIN_ROWS, _pow2(block_keys or BLOCK_KEYS))
    if block_tokens is None:
        smallest = max(1, MIN_ROWS // padded_group)
        max_rows = MAX_ROWS if head_dim <= 128 else MAX_ROWS // 2  # the accumulator lives in registers
        block_tokens = pick_block_tokens(num_tokens, meta.num_seqs, smallest=smallest,
                                         largest=max(smallest, max_rows // padded_group))
    if block_tokens != _pow2(block_tokens) or block_tokens * padded_group < MIN_ROWS:
        raise ValueError(f"block_tokens={block_tokens} must be a power of two with block_tokens * "
                         f"{padded_group} (padded group) >= {MIN_ROWS}")
    if kv_splits is None:
        decode_like = num_tokens <= DECODE_TOKENS_PER_SEQ * meta.num_seqs
        kv_splits = min(MAX_KV_SPLITS, max(1, meta.max_kv_len // (4 * bk))) if decode_like else 1
    plan = plan_query_blocks(meta, sliding_window, block_tokens=block_tokens, block_keys=bk)
    if interpret is None:
        interpret = jax.default_backend() != "gpu"
    out = _attend(q, pool, layer, table, plan, meta.custom_mask, sinks, padded_group=padded_group,
                  scale=head_dim ** -0.5 if scale is None else scale, logit_softcap=logit_softcap,
                  kv_splits=kv_splits, interpret=interpret)
    return out, pool


def _attend(q: jax.Array, pool: KVPool, layer, table: jax.Array, plan: QueryBlocks,
            custom_mask: jax.Array | None, sinks: jax.Array | None, *, padded_group: int, scale: float,
            logit_softcap: float | None, kv_splits: int, interpret: bool) -> jax.Array:
    """Lay the step out in query blocks, run the kernel, merge the splits, and restore token order."""
    _, num_q_heads, head_dim = q.shape
    num_kv_heads = pool.num_kv_heads
    group = num_q_heads // num_kv_heads
    bq, bk, num_blocks = plan.block_tokens, plan.block_keys, plan.max_blocks
    rows = padded_group * bq  # per KV head: row g * bq + i is query head g of the block's token i

    q_blocks = plan.gather(q).reshape(num_blocks, bq, num_kv_heads, group, head_dim)
    q_blocks = jnp.pad(q_blocks, ((0, 0), (0, 0), (0, 0), (0, padded_group - group), (0, 0)))
    q_blocks = q_blocks.transpose(0, 2, 3, 1, 4).reshape(num_blocks, num_kv_heads, rows, head_dim)
    operands = [plan.seq, plan.kv_first, plan.kv_count, table, jnp.asarray(layer, jnp.int32).reshape(1),
                q_blocks, jnp.tile(plan.lo, (1, padded_group)), jnp.tile(plan.hi, (1, padded_group))]
    if custom_mask is not None:
        num_key_blocks = -(-custom_mask.shape[1] // bk)
        mask = jnp.pad(custom_mask, ((0, 0), (0, num_key_blocks * bk - custom_mask.shape[1])))
        operands.append(plan.gather(mask.astype(jnp.int8)))
    operands.append(pool.data)

    kernel = functools.partial(
        _kernel, block_tokens=bq, block_keys=bk, page_size=pool.page_size, max_pages=table.shape[1],
        kv_splits=kv_splits, scale=scale, logit_softcap=logit_softcap, has_mask=custom_mask is not None,
        pool_dtype=pool.dtype, read_dtype=np.dtype(pool.output_dtype), compute_dtype=np.dtype(q.dtype),
        fp8_scale=pool.fp8_scale)
    split_shape = (num_blocks, num_kv_heads, kv_splits, rows)
    num_warps = 8 if rows * head_dim >= 128 * 128 else 4  # a 128 x 128 float32 accumulator needs 8
    per_row = jax.ShapeDtypeStruct(split_shape, jnp.float32)
    o, m, denom_split = pl.pallas_call(
        kernel, grid=(num_blocks, num_kv_heads, kv_splits),
        out_shape=(jax.ShapeDtypeStruct((*split_shape, head_dim), jnp.float32), per_row, per_row),
        compiler_params=pltr.CompilerParams(num_warps=num_warps, num_stages=2),
        interpret=interpret,
    )(*operands)

    # merge the splits (a sink is one more key with a zero value, counted once)
    m_all = m.max(axis=2)  # [NB, Hkv, rows]
    if sinks is not None:
        sink_rows = jnp.pad(sinks.astype(jnp.float32).reshape(num_kv_heads, group),
                            ((0, 0), (0, padded_group - group)), constant_values=_MASKED)
        sink_rows = jnp.repeat(sink_rows, bq, axis=1)  # [Hkv, rows], row g * bq + i -> head g
        m_all = jnp.maximum(m_all, sink_rows)
    weight = jnp.exp(m - m_all[:, :, None]) * denom_split  # [NB, Hkv, splits, rows]
    denom = weight.sum(axis=2)
    if sinks is not None:
        denom = denom + jnp.exp(sink_rows - m_all)
    out = (weight[..., None] * o).sum(axis=2) / jnp.where(denom > 0, denom, 1.0)[..., None]
    out = out.reshape(num_blocks, num_kv_heads, padded_group, bq, head_dim)[:, :, :group]
    out = out.transpose(0, 3, 1, 2, 4).reshape(num_blocks, bq, num_q_heads, head_dim)
    return plan.scatter(out).astype(q.dtype)


def _kernel(seq_ref, kv_first_ref, kv_count_ref, table_ref, layer_ref, q_ref, lo_ref, hi_ref, *refs,
            block_tokens: int, block_keys: int, page_size: int, max_pages: int, kv_splits: int, scale: float,
            logit_softcap: float | None, has_mask: bool, pool_dtype: np.dtype, read_dtype: np.dtype,
            compute_dtype: np.dtype, fp8_scale: float):
    mask_ref = refs[0] if has_mask else None
    pool_ref, o_ref, m_ref, l_ref = refs[has_mask:]
    b, h, split = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    seq, first, count, layer = seq_ref[b], kv_first_ref[b], kv_count_ref[b], layer_ref[0]
    per_split = (count + kv_splits - 1) // kv_splits
    start = split * per_split
    stop = jnp.minimum(start + per_split, count)

    q = pltr.load(q_ref.at[b, h])  # [rows, D]
    rows, head_dim = q.shape
    lo, hi = pltr.load(lo_ref.at[b])[:, None], pltr.load(hi_ref.at[b])[:, None]
    lanes = jnp.arange(head_dim, dtype=jnp.int32)[None, :]
    in_block = jnp.arange(block_keys, dtype=jnp.int32)
    token_of_row = (jnp.arange(rows, dtype=jnp.int32) % block_tokens)[:, None]
    convert = functools.partial(to_compute, pool_dtype=pool_dtype, read_dtype=read_dtype,
                                compute_dtype=compute_dtype, fp8_scale=fp8_scale)
    exact = compute_dtype == np.dtype(jnp.float32)

    def body(i, state):
        m, denom, acc = state
        key_idx = (first + i) * block_keys + in_block  # [bk]
        pages = pltr.load(table_ref.at[seq, jnp.minimum(key_idx // page_size, max_pages - 1)])
        slots = (pages * page_size + key_idx % page_size)[:, None]
        keys = convert(pltr.load(pool_ref.at[layer, slots, 2 * h, lanes]))  # [bk, D]
        values = convert(pltr.load(pool_ref.at[layer, slots, 2 * h + 1, lanes]))
        s = pltr.dot(q, keys, trans_b=True, allow_tf32=not exact) * scale  # [rows, bk] float32
        if logit_softcap is not None:
            s = logit_softcap * jnp.tanh(s / logit_softcap)
        visible = (key_idx[None, :] >= lo) & (key_idx[None, :] < hi)
        if has_mask:
            visible &= pltr.load(mask_ref.at[b, token_of_row, key_idx[None, :]]) != 0
        s = jnp.where(visible, s, _MASKED)
        m_new = jnp.maximum(m, s.max(axis=1))
        p = jnp.where(visible, jnp.exp(s - m_new[:, None]), 0.0)
        correction = jnp.exp(m - m_new)
        pv = pltr.dot(p.astype(values.dtype), values, allow_tf32=not exact)
        return m_new, denom * correction + p.sum(axis=1), acc * correction[:, None] + pv

    state = (jnp.full((rows,), _MASKED, jnp.float32), jnp.zeros((rows,), jnp.float32),
             jnp.zeros((rows, head_dim), jnp.float32))
    m, denom, acc = jax.lax.fori_loop(start, stop, body, state)
    o_ref[b, h, split] = acc / jnp.where(denom > 0, denom, 1.0)[:, None]
    m_ref[b, h, split] = m
    l_ref[b, h, split] = denom
