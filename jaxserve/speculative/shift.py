"""Moving a round's host plan on device, for the overlapped speculative schedule (chains and trees alike).

With overlap, round t+1 is dispatched before the host has read round t's verdict, so a request that was in
round t starts round t+1 at `n + a + 1` with `a` (its accepted drafts) known only on device. The host plans
round t+1 as if round t had advanced the request as far as it can (`advance` tokens: S + 1 for a chain of S
drafts, min(S, N - 1) + 1 for a tree of depth S and N nodes; start `n + advance`, the page table already
covering it) and the round moves each such sequence back by `delta = a + 1 - advance <= 0` here:
positions, key indices, kv lengths and the write slots recomputed from the page table, plus the last token
and the output count the verdict gave. Sequences with `delta = 0` (padding, requests not in round t) keep
what the host built; padding tokens (write slot 0, reserved) are never moved.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxserve.layers.attention_metadata import AttentionMetadata


def _slots(page_table, seq_ids, keys, page_size: int):
    return page_table[seq_ids, keys // page_size] * page_size + keys % page_size


def shift_meta(meta: AttentionMetadata, delta: jax.Array, keys: jax.Array | None = None) -> AttentionMetadata:
    """`meta` with sequence s moved by `delta[s]` tokens (`i32[seqs]`, <= 0, within the page table): rope
    positions and key indices both move. `keys i32[T]`: the tokens' key indices (None: their positions, as
    in a plain causal chain)."""
    d_tok = delta[meta.seq_ids]
    moved = (d_tok != 0) & (meta.write_slots != 0)  # padding tokens write the reserved slot 0: left alone
    keys = meta.positions + d_tok if keys is None else keys + d_tok
    positions = jnp.where(moved, meta.positions + d_tok, meta.positions)
    write = jnp.where(moved, _slots(meta.page_table, meta.seq_ids, keys, meta.page_size), meta.write_slots)
    swa_write = meta.swa_write_slots
    if swa_write is not None:
        swa_write = jnp.where(moved, _slots(meta.swa_page_table, meta.seq_ids, keys, meta.page_size),
                              swa_write)
    return dataclasses.replace(meta, positions=positions, kv_lens=meta.kv_lens + delta, write_slots=write,
                               swa_write_slots=swa_write)


def continue_round(shifts, state_rows, shifted, last, draft_metas, meta, sampling, *, advance: int):
    """A round's plan (`round_plan.RoundPlan`'s device inputs) with the sequences flagged `shifted` moved to
    where the previous round left them: `shifts` holds per state row that round's accepted drafts and last
    emitted token. Draft metadata carry `w` tokens per sequence per draft step at consecutive key indices
    ending at the sequence's kv length (w = 1 for chains, the branching for trees). Returns (last,
    draft_metas, meta, sampling); `sampling.num_generated` grows by the tokens that round emitted."""
    prev_acc = shifts[0][state_rows]
    delta = jnp.where(shifted, prev_acc + 1 - advance, 0)
    last = jnp.where(shifted, shifts[1][state_rows], last)
    meta = shift_meta(meta, delta)
    if draft_metas is not None:
        def shift_step(m: AttentionMetadata) -> AttentionMetadata:
            width = m.num_tokens // m.num_seqs
            keys = m.kv_lens[m.seq_ids] - width + jnp.arange(m.num_tokens) % width
            return shift_meta(m, delta, keys)

        draft_metas = jax.vmap(shift_step)(draft_metas)
    nodes = meta.num_tokens // state_rows.shape[0]
    generated = jnp.repeat(jnp.where(shifted, prev_acc + 1, 0), nodes)
    sampling = dataclasses.replace(sampling, num_generated=sampling.num_generated + generated)
    return last, draft_metas, meta, sampling
