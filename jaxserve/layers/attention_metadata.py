"""Per-step attention metadata: a flat pytree of int32/bool arrays, built on the host and padded to buckets.

Vocabulary (one step = one ragged batch of tokens from several sequences, prefill chunks and decodes mixed):
- token index `t` in `[0, T)`: the step's tokens, sequence after sequence; padding tokens at the end.
- key index `j` of a sequence: the storage position of a cached token, `[0, max_pages * page_size)`. The
  page table maps it to a pool slot: `slot = page_table[s, j // page_size] * page_size + j % page_size`.
  For ordinary decoding `j` equals the token's position; tree verification stores candidates at
  consecutive key indices while their rope positions follow tree depth (see `custom_mask`).
- A query token `t` of sequence `s` at position `p` sees key `j` iff `j < kv_lens[s]`, `p - j < W` on
  sliding layers (W keys including itself, HF semantics), and `j <= p` - or, when `custom_mask` is given,
  `custom_mask[t, j]` instead of `j <= p` (the caller then marks every visible prefix and tree key).
- Padding tokens have `seq_ids = 0`, position 0 and write to slot 0 of each group (reserved, never read by
  a real sequence); padding sequence rows have `kv_lens = 0` and an all-zero page table row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import numpy as np

from jaxserve.memory.host_buffers import aligned_zeros

DEFAULT_TOKEN_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
DEFAULT_SEQ_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DEFAULT_PAGE_BUCKETS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AttentionMetadata:
    """Device-side description of one ragged step (all arrays int32 unless noted).

    Token-level `[T]`: `positions` (rope position), `seq_ids` (row of the sequence-level arrays),
    `write_slots` (full-group pool slot for the token's K/V; 0 for padding), `swa_write_slots` (swa-group
    slot, or None for models without an swa group). Sequence-level: `page_table [S, max_pages]` (full-group
    page ids), `swa_page_table [S, max_pages]` (swa-group page ids, 0 where evicted) or None, `kv_lens [S]`
    (context length including this step's tokens; 0 for padding rows), `sample_idx [S]` (token whose logits
    are returned). `custom_mask`: None, or bool `[T, max_pages * page_size]` replacing the causal test.
    `page_size` is static.
    """

    positions: jax.Array
    seq_ids: jax.Array
    write_slots: jax.Array
    page_table: jax.Array
    kv_lens: jax.Array
    sample_idx: jax.Array
    swa_write_slots: jax.Array | None = None
    swa_page_table: jax.Array | None = None
    custom_mask: jax.Array | None = None
    page_size: int = dataclasses.field(default=1, metadata=dict(static=True))

    @property
    def num_tokens(self) -> int:
        return self.positions.shape[0]

    @property
    def num_seqs(self) -> int:
        return self.kv_lens.shape[0]

    @property
    def max_kv_len(self) -> int:
        """Number of key indices the page table can address (`max_pages * page_size`)."""
        return self.page_table.shape[1] * self.page_size


@dataclasses.dataclass(frozen=True)
class SequenceStep:
    """Host description of one sequence's part of a step.

    `num_new_tokens` tokens occupy key indices `[kv_len - num_new_tokens, kv_len)`; `page_ids` are the
    full-group pages covering key indices `[0, kv_len)` (more is fine); `swa_page_ids` likewise for the swa
    group (0 for evicted pages). `swa_first_page`: `swa_page_ids[0]` is the swa page of page index
    `swa_first_page`; the pages before it read as 0 (a sliding window never reaches them, so the caller need
    not map them). `positions` overrides the rope positions of the new tokens (default: equal to their key
    indices).
    """

    num_new_tokens: int
    kv_len: int
    page_ids: Sequence[int]
    swa_page_ids: Sequence[int] | None = None
    positions: Sequence[int] | None = None
    swa_first_page: int = 0


def pick_bucket(n: int, buckets: Sequence[int], what: str) -> int:
    """Smallest bucket >= n; ValueError naming `what` when n exceeds the largest bucket."""
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"{what}={n} exceeds the largest bucket {max(buckets)}")


def build_attention_metadata(
    steps: Sequence[SequenceStep], *, page_size: int, with_swa: bool = False,
    custom_mask: np.ndarray | None = None,
    token_buckets: Sequence[int] = DEFAULT_TOKEN_BUCKETS,
    seq_buckets: Sequence[int] = DEFAULT_SEQ_BUCKETS,
    page_buckets: Sequence[int] = DEFAULT_PAGE_BUCKETS,
) -> AttentionMetadata:
    """Pack sequences' steps into padded numpy metadata (placed on device by the jitted step).

    Tokens are laid out sequence after sequence in `steps` order, so the caller's `input_ids` follow the
    same order. `sample_idx[s]` is the last token of sequence `s`. `custom_mask` (bool `[num_real_tokens,
    >= kv_len]`) is padded to the bucketed key range. Cost O(T + S * max_pages) on the host.
    """
    if not steps:
        raise ValueError("build_attention_metadata needs at least one sequence")
    ps = page_size
    new = np.fromiter((s.num_new_tokens for s in steps), np.int64, len(steps))
    kv_len = np.fromiter((s.kv_len for s in steps), np.int64, len(steps))
    bad = np.flatnonzero((new <= 0) | (new > kv_len))
    if bad.size:
        s = int(bad[0])
        raise ValueError(f"sequence {s}: num_new_tokens={new[s]} must be in [1, kv_len={kv_len[s]}]")
    num_real = int(new.sum())
    num_tokens = pick_bucket(num_real, token_buckets, "num_tokens")
    num_seqs = pick_bucket(len(steps), seq_buckets, "num_seqs")
    pages_needed = -(-kv_len // ps)
    max_pages = pick_bucket(int(pages_needed.max()), page_buckets, "pages_per_sequence")

    # every sequence's pages scattered into its page-table row at once (columns past max_pages dropped)
    page_table = _page_rows([s.page_ids for s in steps], np.zeros(len(steps), np.int64), num_seqs, max_pages,
                            pages_needed, "pages", ps, kv_len)
    # the new tokens: sequence by sequence, each at key indices [kv_len - new, kv_len)
    seq_of = np.repeat(np.arange(len(steps)), new)
    ends = np.cumsum(new)
    key_idx = kv_len[seq_of] - ends[seq_of] + np.arange(num_real)
    page_of, offset = key_idx // ps, key_idx % ps
    positions = np.zeros(num_tokens, np.int32)
    if any(s.positions is not None for s in steps):
        positions[:num_real] = np.concatenate([
            np.arange(k - n, k) if s.positions is None else np.asarray(s.positions, np.int64).reshape(n)
            for s, n, k in zip(steps, new.tolist(), kv_len.tolist(), strict=True)])
    else:
        positions[:num_real] = key_idx
    seq_ids = np.zeros(num_tokens, np.int32)
    seq_ids[:num_real] = seq_of
    write_slots = np.zeros(num_tokens, np.int32)
    write_slots[:num_real] = page_table[seq_of, page_of].astype(np.int64) * ps + offset
    kv_lens = np.zeros(num_seqs, np.int32)
    kv_lens[: len(steps)] = kv_len
    sample_idx = np.zeros(num_seqs, np.int32)
    sample_idx[: len(steps)] = ends - 1

    swa_page_table = swa_write_slots = None
    if with_swa:
        missing = [i for i, s in enumerate(steps) if s.swa_page_ids is None]
        if missing:
            raise ValueError(f"sequence {missing[0]}: swa_page_ids is required for a model with an swa group")
        lo = np.fromiter((s.swa_first_page for s in steps), np.int64, len(steps))
        late = np.flatnonzero(lo > (kv_len - new) // ps)
        if late.size:
            s = int(late[0])
            raise ValueError(f"sequence {s}: swa_first_page={lo[s]} is past the first new token's page")
        # the swa pages cover page indices [lo, pages_needed): the window's pages, mapped from lo on
        swa_page_table = _page_rows([s.swa_page_ids for s in steps], lo, num_seqs, max_pages, pages_needed,
                                    "swa pages", ps, kv_len)
        swa_write_slots = np.zeros(num_tokens, np.int32)
        swa_write_slots[:num_real] = swa_page_table[seq_of, page_of].astype(np.int64) * ps + offset

    mask = None
    if custom_mask is not None:
        custom_mask = np.asarray(custom_mask, bool)
        if custom_mask.shape[0] != num_real or custom_mask.shape[1] > max_pages * page_size:
            raise ValueError(f"custom_mask shape {custom_mask.shape} does not fit {num_real} tokens x "
                             f"{max_pages * page_size} key indices")
        mask = np.zeros((num_tokens, max_pages * page_size), bool)
        mask[:num_real, : custom_mask.shape[1]] = custom_mask
    return AttentionMetadata(
        positions=positions, seq_ids=seq_ids, write_slots=write_slots, page_table=page_table,
        kv_lens=kv_lens, sample_idx=sample_idx, swa_write_slots=swa_write_slots,
        swa_page_table=swa_page_table, custom_mask=mask, page_size=page_size)


def _page_rows(page_ids: Sequence[Sequence[int]], first: np.ndarray, num_seqs: int, max_pages: int,
               pages_needed: np.ndarray, what: str, page_size: int, kv_len: np.ndarray) -> np.ndarray:
    """i32[num_seqs, max_pages]: row s holds `page_ids[s]` from column `first[s]` on (columns past
    max_pages dropped), zeros elsewhere. ValueError when a sequence's pages stop short of its `kv_len`
    (`pages_needed[s]` pages from index 0). One slice copy per sequence: with one-token pages a row is a
    context's worth of ids, which a copy moves far faster than a scatter of every id would."""
    counts = np.fromiter((len(p) for p in page_ids), np.int64, len(page_ids))
    short = np.flatnonzero(first + counts < pages_needed)
    if short.size:
        s = int(short[0])
        raise ValueError(f"sequence {s}: {counts[s]} {what} of {page_size} from page {first[s]} cannot hold "
                         f"kv_len={kv_len[s]}")
    table = aligned_zeros((num_seqs, max_pages), np.int32)  # a long context's table goes to the step uncopied
    for row, (pages, lo) in enumerate(zip(page_ids, first.tolist(), strict=True)):
        if lo < max_pages:
            table[row, lo: lo + len(pages)] = pages[: max_pages - lo]
    return table
