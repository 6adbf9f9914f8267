"""Ragged paged attention as a Pallas TPU (Mosaic) kernel: backend `pallas_tpu`.

One `pallas_call` attends a whole ragged step (prefill chunks and decodes mixed). The step's tokens are
cut into query blocks of one sequence each (`query_blocks`); program `b` of the grid takes block `b`,
stacks the G query heads of each KV head as `G * bq` rows, and walks its sequence's key blocks: each key
block is `pages_per_block` pages copied from the pool in HBM into VMEM by one async copy per page, found
through the sequence's page-table row (copied into SMEM per query block, so SMEM holds one row, not the
whole table). Two VMEM slots alternate, so the next block's copies are in flight while the current one
is scored (online softmax in float32). Only the blocks the rows can see are copied: none past kv_len,
before the window, or past the causal edge.

Visibility, sinks, soft-cap and scale are exactly `native`'s (see `jaxserve.layers.attention_metadata`).
The custom (tree) mask, when given, is copied per key block alongside the pages. Pool dtypes: float32,
bfloat16 (stored as uint16 bits) and float8_e4m3fn (uint8 bits times the pool's `fp8_scale`); bits are
converted after the copy, in VMEM, each KV head's K and V read with one strided load of 32-bit words.
On a machine without a TPU the kernel runs in a Pallas interpreter (see `interpret`), which is what the
CPU tests exercise. Page size 1 works but costs one copy per key.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from jaxserve.layers.attention_metadata import AttentionMetadata
from jaxserve.layers.backends import register_backend
from jaxserve.layers.backends.native import write_slots_and_table
from jaxserve.layers.backends.query_blocks import QueryBlocks, pick_block_tokens, plan_query_blocks
from jaxserve.memory.kv_pool import KVPool, write_kv

_MASKED = -1e30  # finite, so a fully masked block leaves the running max finite and its weights at 0
BLOCK_KEYS = 256  # key indices per key block (rounded down to whole pages, at least one page)
MAX_ROWS = 512  # default cap on G * block_tokens: the float32 accumulator rows per KV head in VMEM


@register_backend("pallas_tpu")
def ragged_paged_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, pool: KVPool, layer: int, meta: AttentionMetadata, *,
    use_swa_tables: bool = False, sliding_window: int | None = None, sinks: jax.Array | None = None,
    logit_softcap: float | None = None, scale: float | None = None, block_keys: int | None = None,
    block_tokens: int | None = None, interpret: bool | pltpu.InterpretParams | None = None,
) -> tuple[jax.Array, KVPool]:
    """Same contract as `native.paged_attention`: write `k, v [T, kv_heads, D]` into layer `layer`, then
    attend `q [T, q_heads, D]`; returns `(out [T, q_heads, D] in q's dtype, new_pool)`.

    `block_keys`: key indices per key block (in tokens; default `BLOCK_KEYS`, at most the table's
    `max_kv_len`, rounded down to whole pages). `block_tokens`: tokens per query block (a multiple of 8;
    default about T / S, 8 to 128, at most `MAX_ROWS` rows of G query heads).
    `interpret`: False compiles for the TPU; True runs the same kernel in Pallas's HLO interpreter; a
    `pltpu.InterpretParams` runs it in the TPU interpreter (simulated DMAs and semaphores), which cannot
    reshape or bitcast a ref, so K and V are read there by plain indexing instead of the device's packed
    strided loads. Default: False on a TPU, True elsewhere.
    ValueError for an fp8 pool with an odd number of KV heads (four fp8 rows share one 32-bit word) or a
    `block_tokens` that is not a multiple of 8.
    """
    slots_new, table = write_slots_and_table(meta, pool, use_swa_tables)
    pool = write_kv(pool, layer, slots_new, k, v)  # write first: the kernel reads the new pool
    meta, table = jax.tree.map(jnp.asarray, (meta, table))
    num_tokens, _, head_dim = q.shape
    page_size = meta.page_size
    pages_per_block = max(1, min(block_keys or BLOCK_KEYS, meta.max_kv_len) // page_size)
    if block_tokens is None:
        most = max(8, MAX_ROWS // (q.shape[1] // pool.num_kv_heads) // 8 * 8)
        block_tokens = pick_block_tokens(num_tokens, meta.num_seqs, largest=most)
    if block_tokens % 8:
        raise ValueError(f"block_tokens={block_tokens} must be a multiple of 8 (TPU sublanes)")
    plan = plan_query_blocks(meta, sliding_window, block_tokens=block_tokens,
                             block_keys=pages_per_block * page_size)
    if interpret is None:
        interpret = jax.default_backend() != "tpu"
    if pool.dtype == np.dtype(jnp.float8_e4m3fn) and pool.num_kv_heads % 2:
        raise ValueError(f"pallas_tpu reads fp8 pools as 32-bit words of two KV heads' K and V; "
                         f"{pool.num_kv_heads} KV heads is odd")
    out = _attend(q, pool, layer, table, plan, meta.custom_mask, sinks,
                  scale=head_dim ** -0.5 if scale is None else scale, logit_softcap=logit_softcap,
                  pages_per_block=pages_per_block, interpret=interpret)
    return out, pool


def _attend(q: jax.Array, pool: KVPool, layer, table: jax.Array, plan: QueryBlocks,
            custom_mask: jax.Array | None, sinks: jax.Array | None, *, scale: float,
            logit_softcap: float | None, pages_per_block: int,
            interpret: bool | pltpu.InterpretParams) -> jax.Array:
    """Lay the step out in query blocks, run the kernel, and put the rows back in token order."""
    _, num_q_heads, head_dim = q.shape
    num_kv_heads = pool.num_kv_heads
    group = num_q_heads // num_kv_heads
    bq, bk = plan.block_tokens, plan.block_keys
    num_blocks = plan.max_blocks
    rows = group * bq  # per KV head: row g * bq + i is query head g of the block's token i

    q_blocks = plan.gather(q).reshape(num_blocks, bq, num_kv_heads, group, head_dim)
    q_blocks = q_blocks.transpose(0, 2, 3, 1, 4).reshape(num_blocks, num_kv_heads, rows, head_dim)
    scalars = (plan.seq, plan.kv_first, plan.kv_count, jnp.asarray(layer, jnp.int32).reshape(1))
    operands = [q_blocks, plan.lo[..., None], plan.hi[..., None]]
    row_block = lambda b, *_: (b, 0, 0)
    in_specs = [pl.BlockSpec((1, num_kv_heads, rows, head_dim), lambda b, *_: (b, 0, 0, 0)),
                pl.BlockSpec((1, bq, 1), row_block), pl.BlockSpec((1, bq, 1), row_block)]
    if sinks is not None:
        sink_rows = jnp.broadcast_to(sinks.astype(jnp.float32).reshape(num_kv_heads, group, 1),
                                     (num_kv_heads, group, bq)).reshape(num_kv_heads, rows, 1)
        operands.append(sink_rows)
        in_specs.append(pl.BlockSpec((num_kv_heads, rows, 1), lambda b, *_: (0, 0, 0)))
    operands.append(table)
    in_specs.append(pl.BlockSpec(memory_space=pl.ANY))
    scratch = [pltpu.VMEM((2, bk, 2 * num_kv_heads, head_dim), pool.storage_dtype)]
    if custom_mask is not None:
        num_key_blocks = -(-custom_mask.shape[1] // bk)
        mask = jnp.pad(custom_mask, ((0, 0), (0, num_key_blocks * bk - custom_mask.shape[1])))
        operands.append(plan.gather(mask.astype(jnp.int32)))
        in_specs.append(pl.BlockSpec(memory_space=pl.ANY))
        scratch.append(pltpu.VMEM((2, bq, bk), jnp.int32))
    operands.append(pool.data)
    in_specs.append(pl.BlockSpec(memory_space=pl.ANY))
    per_row = pltpu.VMEM((num_kv_heads, rows, 1), jnp.float32)  # running max, denominator
    scratch += [pltpu.SMEM((table.shape[1],), jnp.int32), pltpu.SemaphoreType.DMA((2, 2)), per_row, per_row,
                pltpu.VMEM((num_kv_heads, rows, head_dim), jnp.float32)]

    kernel = functools.partial(
        _kernel, num_kv_heads=num_kv_heads, group=group, block_tokens=bq, page_size=pool.page_size,
        pages_per_block=pages_per_block, max_pages=table.shape[1], scale=scale, logit_softcap=logit_softcap,
        has_sinks=sinks is not None, has_mask=custom_mask is not None, pool_dtype=pool.dtype,
        read_dtype=np.dtype(pool.output_dtype), compute_dtype=np.dtype(q.dtype), fp8_scale=pool.fp8_scale,
        packed_loads=not isinstance(interpret, pltpu.InterpretParams))
    out_blocks = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=len(scalars), grid=(num_blocks,), in_specs=in_specs,
            out_specs=pl.BlockSpec((1, num_kv_heads, rows, head_dim), lambda b, *_: (b, 0, 0, 0)),
            scratch_shapes=scratch),
        out_shape=jax.ShapeDtypeStruct((num_blocks, num_kv_heads, rows, head_dim), q.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        interpret=interpret,
    )(*scalars, *operands)
    out_blocks = out_blocks.reshape(num_blocks, num_kv_heads, group, bq, head_dim).transpose(0, 3, 1, 2, 4)
    return plan.scatter(out_blocks.reshape(num_blocks, bq, num_q_heads, head_dim))


def to_compute(bits: jax.Array, *, pool_dtype: np.dtype, read_dtype: np.dtype, compute_dtype: np.dtype,
               fp8_scale: float) -> jax.Array:
    """Stored K or V bits -> the dtype `read_kv` returns, then the query's dtype (as `native` does)."""
    if pool_dtype == np.dtype(jnp.bfloat16):
        x = jax.lax.bitcast_convert_type(bits, jnp.bfloat16)
    elif pool_dtype == np.dtype(jnp.float8_e4m3fn):
        x = jax.lax.bitcast_convert_type(bits, jnp.float8_e4m3fn).astype(jnp.float32) * fp8_scale
    else:
        x = bits
    return x.astype(read_dtype).astype(compute_dtype)


def load_head_packed(kv_buf, slot, head: int, *, pool_dtype: np.dtype,
                     fp8_scale: float) -> tuple[jax.Array, jax.Array]:
    """K and V `[bk, D]` (float32) of KV head `head` from VMEM slot `slot` of `kv_buf [2, bk, 2Hkv, D]`.

    The slot is read as rows `[bk * 2Hkv, D]` with one strided load per head: K of head h at row
    2h + 2Hkv * key, V one row after it. Narrow dtypes are read as 32-bit words (Mosaic's strided loads
    are dependable on 32-bit rows, not on packed 16- or 8-bit ones): a word holds two bf16 rows (K low,
    V high; placed in the high half, a bf16's bits are its float32 value) or four fp8 rows (K, V of heads
    2j and 2j + 1).
    """
    _, bk, rows_per_key, head_dim = kv_buf.shape
    rows = kv_buf.at[slot].reshape(bk * rows_per_key, head_dim)  # static starts from here on
    if pool_dtype == np.dtype(jnp.float32):
        return tuple(rows[pl.ds(2 * head + half, bk, stride=rows_per_key), :] for half in (0, 1))
    per_word = 4 // np.dtype(rows.dtype).itemsize
    words_per_key = rows_per_key // per_word
    words = rows.bitcast(jnp.uint32)[pl.ds(2 * head // per_word, bk, stride=words_per_key), :]
    if pool_dtype == np.dtype(jnp.bfloat16):
        return (pltpu.bitcast(words << 16, jnp.float32),
                pltpu.bitcast(words & jnp.uint32(0xFFFF0000), jnp.float32))
    shift = 16 * (head % 2)
    fp8 = lambda w: pltpu.bitcast((w & 0xFF).astype(jnp.uint8), jnp.float8_e4m3fn).astype(jnp.float32)
    return fp8(words >> shift) * fp8_scale, fp8(words >> (shift + 8)) * fp8_scale


def _kernel(seq_ref, kv_first_ref, kv_count_ref, layer_ref, q_ref, lo_ref, hi_ref, *refs,
            num_kv_heads: int, group: int, block_tokens: int, page_size: int, pages_per_block: int,
            max_pages: int, scale: float, logit_softcap: float | None, has_sinks: bool, has_mask: bool,
            pool_dtype: np.dtype, read_dtype: np.dtype, compute_dtype: np.dtype, fp8_scale: float,
            packed_loads: bool):
    refs = list(refs)
    sink_ref = refs.pop(0) if has_sinks else None
    table_hbm = refs.pop(0)
    mask_hbm = refs.pop(0) if has_mask else None
    pool_hbm, out_ref, kv_buf = refs[:3]
    mask_buf = refs[3] if has_mask else None
    table_row, sem, m_ref, l_ref, acc_ref = refs[3 + has_mask:]

    b = pl.program_id(0)
    seq, first, count, layer = seq_ref[b], kv_first_ref[b], kv_count_ref[b], layer_ref[0]
    bq, bk = block_tokens, pages_per_block * page_size
    rows = group * bq

    def page_copy(kb, p, slot):
        """The async copy of page `p` of the sequence's key block `kb` into VMEM slot `slot`."""
        page = table_row[jnp.minimum(kb * pages_per_block + p, max_pages - 1)]
        return pltpu.make_async_copy(pool_hbm.at[layer, pl.ds(page * page_size, page_size)],
                                     kv_buf.at[slot, pl.ds(p * page_size, page_size)], sem.at[0, slot])

    def mask_copy(kb, slot):
        columns = mask_hbm.at[b, :, pl.ds(kb * bk, bk)]
        return pltpu.make_async_copy(columns, mask_buf.at[slot], sem.at[1, slot])

    def start(i, slot):
        """Start filling VMEM slot `slot` with key block `first + i` (its pages and mask columns)."""
        kb = first + i
        jax.lax.fori_loop(0, pages_per_block, lambda p, c: (page_copy(kb, p, slot).start(), c)[1], 0)
        if has_mask:
            mask_copy(kb, slot).start()

    def wait(slot):
        # every page copy has the same size, so one descriptor waits for each of them in turn
        jax.lax.fori_loop(0, pages_per_block, lambda p, c: (page_copy(first, 0, slot).wait(), c)[1], 0)
        if has_mask:
            mask_copy(first, slot).wait()

    if has_sinks:
        m_ref[...] = sink_ref[...]
        l_ref[...] = jnp.ones(l_ref.shape, jnp.float32)
    else:
        m_ref[...] = jnp.full(m_ref.shape, _MASKED, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
    acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    @pl.when(count > 0)
    def _():
        pltpu.sync_copy(table_hbm.at[seq], table_row)
        start(0, 0)

    def body(i, carry):
        slot = i % 2

        @pl.when(i + 1 < count)
        def _():
            start(i + 1, 1 - slot)

        wait(slot)
        key_idx = (first + i) * bk + jax.lax.broadcasted_iota(jnp.int32, (1, bk), 1)
        visible = (key_idx >= lo_ref[0]) & (key_idx < hi_ref[0])  # [bq, bk]
        if has_mask:
            visible &= mask_buf[slot] != 0
        visible = jnp.broadcast_to(visible[None], (group, bq, bk)).reshape(rows, bk)
        for h in range(num_kv_heads):
            if packed_loads:
                keys, values = (x.astype(read_dtype).astype(compute_dtype) for x in load_head_packed(
                    kv_buf, slot, h, pool_dtype=pool_dtype, fp8_scale=fp8_scale))
            else:
                keys, values = (to_compute(kv_buf[slot, :, 2 * h + half, :], pool_dtype=pool_dtype,
                                           read_dtype=read_dtype, compute_dtype=compute_dtype,
                                           fp8_scale=fp8_scale) for half in (0, 1))  # [bk, D]
            s = jax.lax.dot_general(q_ref[0, h], keys, (((1,), (1,)), ((), ())),
                                    preferred_element_type=jnp.float32) * scale  # [rows, bk]
            if logit_softcap is not None:
                s = logit_softcap * jnp.tanh(s / logit_softcap)
            s = jnp.where(visible, s, _MASKED)
            m_prev = m_ref[h]
            m_new = jnp.maximum(m_prev, s.max(axis=-1, keepdims=True))
            p = jnp.where(visible, jnp.exp(s - m_new), 0.0)
            correction = jnp.exp(m_prev - m_new)
            m_ref[h] = m_new
            l_ref[h] = l_ref[h] * correction + p.sum(axis=-1, keepdims=True)
            acc_ref[h] = acc_ref[h] * correction + jax.lax.dot_general(
                p.astype(values.dtype), values, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
        return carry

    jax.lax.fori_loop(0, count, body, 0)
    denom = l_ref[...]
    out_ref[0] = (acc_ref[...] / jnp.where(denom > 0, denom, 1.0)).astype(out_ref.dtype)
