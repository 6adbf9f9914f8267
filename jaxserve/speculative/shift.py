"""Moving a chain round's metadata on device, for the overlapped speculative schedule.

With overlap, round t+1 is dispatched before the host has read round t's verdict, so a request that was in
round t starts round t+1 at `n + a + 1` with `a` (its accepted drafts) known only on device. The host builds
round t+1's metadata as if every draft of round t were accepted (start `n + S + 1`, the furthest it can be;
the page table already covers it) and the round shifts each such sequence back by
`delta = a + 1 - (S + 1) <= 0` here: positions, kv lengths and the write slots recomputed from the page
table. Sequences with `delta = 0` (padding, requests not in round t) keep what the host built.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxserve.layers.attention_metadata import AttentionMetadata


def _slots(page_table, seq_ids, positions, page_size: int):
    return page_table[seq_ids, positions // page_size] * page_size + positions % page_size


def shift_meta(meta: AttentionMetadata, delta: jnp.ndarray) -> AttentionMetadata:
    """`meta` of plain causal chains (positions equal key indices) with sequence s moved by `delta[s]`
    tokens (`i32[seqs]`, <= 0, within the page table)."""
    d_tok = delta[meta.seq_ids]
    moved = d_tok != 0
    positions = meta.positions + d_tok
    write = jnp.where(moved, _slots(meta.page_table, meta.seq_ids, positions, meta.page_size),
                      meta.write_slots)
    swa_write = meta.swa_write_slots
    if swa_write is not None:
        swa_write = jnp.where(moved, _slots(meta.swa_page_table, meta.seq_ids, positions, meta.page_size),
                              swa_write)
    return dataclasses.replace(meta, positions=positions, kv_lens=meta.kv_lens + delta, write_slots=write,
                               swa_write_slots=swa_write)
