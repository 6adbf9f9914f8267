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
    num_real = sum(s.num_new_tokens for s in steps)
    num_tokens = pick_bucket(num_real, token_buckets, "num_tokens")
    num_seqs = pick_bucket(len(steps), seq_buckets, "num_seqs")
    pages_needed = max(-(-s.kv_len // page_size) for s in steps)
    max_pages = pick_bucket(pages_needed, page_buckets, "pages_per_sequence")

    positions = np.zeros(num_tokens, np.int32)
    seq_ids = np.zeros(num_tokens, np.int32)
    write_slots = np.zeros(num_tokens, np.int32)
    swa_write_slots = np.zeros(num_tokens, np.int32)
    page_table = np.zeros((num_seqs, max_pages), np.int32)
    swa_page_table = np.zeros((num_seqs, max_pages), np.int32)
    kv_lens = np.zeros(num_seqs, np.int32)
    sample_idx = np.zeros(num_seqs, np.int32)

    t = 0
    for s, step in enumerate(steps):
        n, kv_len = step.num_new_tokens, step.kv_len
        if not 0 < n <= kv_len:
            raise ValueError(f"sequence {s}: num_new_tokens={n} must be in [1, kv_len={kv_len}]")
        pages = np.asarray(step.page_ids, np.int32)
        if pages.size * page_size < kv_len:
            raise ValueError(f"sequence {s}: {pages.size} pages of {page_size} cannot hold kv_len={kv_len}")
        key_idx = np.arange(kv_len - n, kv_len)
        page_table[s, : pages.size] = pages[:max_pages]
        write_slots[t: t + n] = pages[key_idx // page_size] * page_size + key_idx % page_size
        if with_swa:
            if step.swa_page_ids is None:
                raise ValueError(f"sequence {s}: swa_page_ids is required for a model with an swa group")
            swa_pages, lo = np.asarray(step.swa_page_ids, np.int32), step.swa_first_page
            if lo > (kv_len - n) // page_size:
                raise ValueError(f"sequence {s}: swa_first_page={lo} is past the first new token's page")
            swa_page_table[s, lo: lo + swa_pages.size] = swa_pages[: max(max_pages - lo, 0)]
            swa_write_slots[t: t + n] = swa_pages[key_idx // page_size - lo] * page_size + key_idx % page_size
        positions[t: t + n] = key_idx if step.positions is None else np.asarray(step.positions)
        seq_ids[t: t + n] = s
        kv_lens[s] = kv_len
        sample_idx[s] = t + n - 1
        t += n

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
        kv_lens=kv_lens, sample_idx=sample_idx,
        swa_write_slots=swa_write_slots if with_swa else None,
        swa_page_table=swa_page_table if with_swa else None,
        custom_mask=mask, page_size=page_size)
