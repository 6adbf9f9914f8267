"""Query blocks: a ragged step's tokens cut into fixed-size row blocks, each from one sequence.

The Pallas kernels run one program per query block: `block_tokens` consecutive tokens of one sequence
(fewer at a sequence's end; the other rows are empty). A block attends its sequence's keys in key blocks
of `block_keys` key indices, from the first key block any of its rows can see to the last. Computed in
plain JAX, O(T + NB) per step, inside the jitted step (no host sync).

Assumes the `AttentionMetadata` layout: each sequence's tokens are contiguous and padding tokens follow
the last sequence, so a step has at most `S + 1` runs of equal `seq_ids` and `max_blocks` blocks suffice.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxserve.layers.attention_metadata import AttentionMetadata
from jaxserve.layers.backends.xla import visible_key_range


def pick_block_tokens(num_tokens: int, num_seqs: int, smallest: int = 8, largest: int = 128) -> int:
    """Tokens per query block from the step's shape: about T / S (a power of two) in
    `[smallest, largest]`, so decodes mixed into a prefill step each pay for a small block of rows."""
    per_seq = max(1, num_tokens // max(1, num_seqs))
    return max(smallest, min(largest, 1 << (per_seq - 1).bit_length()))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class QueryBlocks:
    """Block layout of one step (int32 arrays; NB = `max_blocks`, bq = `block_tokens`).

    `seq [NB]`: the block's sequence row (unused blocks have no rows and no key blocks).
    `kv_first, kv_count [NB]`: the key blocks to visit, `[kv_first, kv_first + kv_count)`, in units of
    `block_keys` key indices. `rows [NB, bq]`: the token of each row (-1 for an empty row); `lo, hi
    [NB, bq]`: the row's visible key indices `[lo, hi)` before any custom mask (0, 0 for empty rows).
    `token_row [T]`: where each token sits, as a flat row index `block * bq + row`.
    """

    seq: jax.Array
    kv_first: jax.Array
    kv_count: jax.Array
    rows: jax.Array
    lo: jax.Array
    hi: jax.Array
    token_row: jax.Array
    block_tokens: int = dataclasses.field(metadata=dict(static=True))
    block_keys: int = dataclasses.field(metadata=dict(static=True))

    @property
    def max_blocks(self) -> int:
        return self.seq.shape[0]

    def gather(self, x: jax.Array) -> jax.Array:
        """Token-major `x [T, ...]` -> `[NB, bq, ...]` (zeros in empty rows)."""
        safe = jnp.maximum(self.rows, 0)
        taken = x[safe]
        valid = (self.rows >= 0).reshape(*self.rows.shape, *([1] * (x.ndim - 1)))
        return jnp.where(valid, taken, jnp.zeros((), x.dtype))

    def scatter(self, blocks: jax.Array) -> jax.Array:
        """Inverse of `gather`: `[NB, bq, ...]` -> token-major `[T, ...]`."""
        flat = blocks.reshape(-1, *blocks.shape[2:])
        return flat[self.token_row]


def plan_query_blocks(meta: AttentionMetadata, sliding_window: int | None, *, block_tokens: int,
                      block_keys: int) -> QueryBlocks:
    """Cut the step into query blocks of `block_tokens` tokens and bound each block's key blocks (of
    `block_keys` key indices) by its rows' visible ranges (kv_len, causal edge, window)."""
    num_tokens = meta.num_tokens
    seq_ids = meta.seq_ids
    bq = block_tokens
    max_blocks = min(num_tokens, -(-num_tokens // bq) + meta.num_seqs + 1)
    t = jnp.arange(num_tokens, dtype=jnp.int32)
    new_seq = jnp.concatenate([jnp.ones(1, bool), seq_ids[1:] != seq_ids[:-1]])
    seq_start = jax.lax.cummax(jnp.where(new_seq, t, 0))
    starts = new_seq | ((t - seq_start) % bq == 0)
    block_of = jnp.cumsum(starts, dtype=jnp.int32) - 1
    block_start = jnp.nonzero(starts, size=max_blocks, fill_value=num_tokens)[0].astype(jnp.int32)

    rows = block_start[:, None] + jnp.arange(bq, dtype=jnp.int32)[None, :]
    mine = block_of[jnp.minimum(rows, num_tokens - 1)] == jnp.arange(max_blocks)[:, None]
    rows = jnp.where((rows < num_tokens) & mine, rows, -1)
    lo_tok, hi_tok = visible_key_range(meta, sliding_window)
    valid = rows >= 0
    safe = jnp.maximum(rows, 0)
    lo = jnp.where(valid, lo_tok[safe], 0)
    hi = jnp.where(valid, hi_tok[safe], 0)
    nonempty = hi > lo
    first_key = jnp.where(nonempty, lo, jnp.iinfo(jnp.int32).max).min(axis=1)
    end_key = jnp.where(nonempty, hi, 0).max(axis=1)
    any_visible = nonempty.any(axis=1)
    kv_first = jnp.where(any_visible, first_key // block_keys, 0)
    kv_count = jnp.where(any_visible, (end_key - 1) // block_keys + 1 - kv_first, 0)
    token_row = block_of * bq + (t - block_start[block_of])
    return QueryBlocks(seq=seq_ids[jnp.minimum(block_start, num_tokens - 1)],
                       kv_first=kv_first.astype(jnp.int32), kv_count=kv_count.astype(jnp.int32),
                       rows=rows, lo=lo, hi=hi, token_row=token_row, block_tokens=bq, block_keys=block_keys)
