"""`StepInput`: the one flat pytree that crosses the host/device boundary per step, and its builder.

A step is a ragged batch: sequence after sequence, each feeding `num_tokens` tokens starting at position
`start` (a prefill chunk, or one decode token). Shapes are padded to `Buckets` so the jitted step compiles
once per (tokens, sequences, pages) bucket triple; padding tokens write to the reserved slot 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import jax
import numpy as np

from jaxserve.engine.kv_cache import KVCache
from jaxserve.engine.request import Request
from jaxserve.layers.attention_metadata import AttentionMetadata, SequenceStep, build_attention_metadata
from jaxserve.sampling import SamplingBatch, SamplingParams, SamplingRow, build_sampling_batch
from jaxserve.sampling.grammar import fill_bitmask

_PAD_PARAMS = SamplingParams(temperature=0.0)
MIN_CONTEXT_TOKENS = 256  # the narrowest page table covers this many tokens of context


def _powers_of_two(lo: int, hi: int) -> tuple[int, ...]:
    """lo, 2*lo, 4*lo, ... below hi, then hi itself (hi >= 1)."""
    out, b = [], lo
    while b < hi:
        out.append(b)
        b *= 2
    return (*out, hi)


@dataclasses.dataclass(frozen=True)
class Buckets:
    """Padded sizes: `tokens` per step, `seqs` per step, `pages` per sequence (page-table width)."""

    tokens: tuple[int, ...]
    seqs: tuple[int, ...]
    pages: tuple[int, ...]

    @classmethod
    def for_limits(cls, *, max_tokens: int, max_seqs: int, max_pages: int, page_size: int = 1) -> Buckets:
        """Powers of two up to each limit, the limit itself last: tokens from 16, sequences from 1, and
        page-table widths from the first that covers `MIN_CONTEXT_TOKENS` (at least 4 pages). Starting the
        widths there keeps a short request inside one width for its whole life (each width is another
        compiled program per token and sequence bucket). The price is padding: the native backend gathers
        and masks the whole width (xla skips key blocks past each sequence's length)."""
        first_pages = max(4, -(-MIN_CONTEXT_TOKENS // page_size))
        return cls(_powers_of_two(min(16, max_tokens), max_tokens), _powers_of_two(1, max_seqs),
                   _powers_of_two(min(first_pages, max_pages), max_pages))

    def check_covers(self, *, max_tokens: int, max_seqs: int, max_pages: int) -> None:
        """Raise ValueError unless the largest bucket of each kind covers the largest step possible."""
        for name, limit in (("tokens", max_tokens), ("seqs", max_seqs), ("pages", max_pages)):
            if max(getattr(self, name)) < limit:
                raise ValueError(f"buckets.{name} tops out at {max(getattr(self, name))} but steps may need "
                                 f"{limit}")

    @property
    def num_shapes(self) -> int:
        """Upper bound on the step's compilations: every (tokens, seqs, pages) triple with seqs <= tokens."""
        return sum(1 for t in self.tokens for s in self.seqs if s <= t) * len(self.pages)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class StepInput:
    """input_ids i32[T]; `prev_rows` i32[T]: -1, or the row of the previous step's sampled tokens that
    replaces the token (a token sampled on device and not read back yet); `meta` (positions, slots, page
    tables, kv_lens, sample_idx); `sampling` (one row per sequence, padded to S)."""

    input_ids: np.ndarray | jax.Array
    prev_rows: np.ndarray | jax.Array
    meta: AttentionMetadata
    sampling: SamplingBatch


@dataclasses.dataclass(frozen=True)
class ScheduledSeq:
    """`req` feeds its tokens `[start, start + num_tokens)` this step; `samples`: they end its fill, so the
    step samples its next token."""

    req: Request
    start: int
    num_tokens: int
    samples: bool


def build_step_input(seqs: Sequence[ScheduledSeq], kv: KVCache, buckets: Buckets,
                     prev_rows: Mapping[Request, int] | None = None, *, masks: bool = True) -> StepInput:
    """Pack the scheduled sequences (their slots already allocated) into a padded StepInput. O(T + S*pages)
    on the host, plus O(window) per sequence for the SWA group of a hybrid pool. A request's token that is
    still pending (sampled by the step in flight) is taken on device from that step's row `prev_rows[req]`.
    Rows of sequences that do not sample get greedy padding params.
    `masks=False`: no grammar masks (the caller fills them later, see `engine.split_step`)."""
    steps, rows, known_spans, from_prev = [], [], [], []
    stops = [seq.start + seq.num_tokens for seq in seqs]
    # one allocator call per step; the SWA group is mapped only where the window reaches
    swa_from = [kv.window_start(seq.start) for seq in seqs] if kv.hybrid else None
    fulls, swas = kv.page_ids_many([seq.req.cached for seq in seqs], stops, swa_from)
    t = 0
    for i, (seq, stop) in enumerate(zip(seqs, stops, strict=True)):
        req = seq.req
        if swas is None:
            steps.append(SequenceStep(seq.num_tokens, stop, fulls[i]))
        else:
            steps.append(SequenceStep(seq.num_tokens, stop, fulls[i], swas[i],
                                      swa_first_page=kv.swa_first_page(swa_from[i])))
        # the tokens on the host are the prompt and the outputs read so far (not the pending ones)
        num_known = max(0, min(stop, req.fill_len - req.num_pending) - seq.start)
        if num_known < seq.num_tokens:  # the last token is pending: one at most, read on device
            if prev_rows is None or req not in prev_rows or num_known + 1 != seq.num_tokens:
                missing = seq.num_tokens - num_known
                raise ValueError(f"request {req.rid}: {missing} tokens to feed are not known on the host")
            from_prev.append((t + seq.num_tokens - 1, prev_rows[req]))
        if num_known:
            known_spans.append((t, req, seq.start, num_known))
        t += seq.num_tokens
        if seq.samples:
            num_generated = len(req.output_ids) + req.num_pending - 1  # this step's sample is pending already
            rows.append(SamplingRow(req.params, req.seed, num_generated, req.penalty_row))
        else:
            rows.append(SamplingRow(_PAD_PARAMS, 0, 0, None))
    meta = build_attention_metadata(steps, page_size=kv.page_size, with_swa=kv.hybrid,
                                    token_buckets=buckets.tokens, seq_buckets=buckets.seqs,
                                    page_buckets=buckets.pages)
    input_ids = np.zeros(meta.num_tokens, np.int32)
    for t, req, start, num_known in known_spans:  # (a decode whose token is pending has none)
        input_ids[t: t + num_known] = req.fill_ids()[start: start + num_known]
    prev = np.full(meta.num_tokens, -1, np.int32)
    if from_prev:
        prev[[token for token, _ in from_prev]] = [row for _, row in from_prev]
    # rows of requests with a grammar carry its mask (their last token is on the host: see Engine.step)
    bitmask = fill_bitmask([seq.req.grammar if seq.samples else None for seq in seqs], meta.num_seqs) \
        if masks else None
    sampling = build_sampling_batch(rows, meta.num_seqs, bitmask)
    return StepInput(input_ids, prev, meta, sampling)


def padding_meta(num_tokens: int, num_seqs: int, num_pages: int, *, page_size: int,
                 hybrid: bool) -> AttentionMetadata:
    """All-padding attention metadata of exactly these bucket sizes: writes go to slot 0 (the padding page),
    every page-table entry is page 0; with `hybrid`, the swa pair too."""
    return AttentionMetadata(
        positions=np.zeros(num_tokens, np.int32), seq_ids=np.zeros(num_tokens, np.int32),
        write_slots=np.zeros(num_tokens, np.int32), page_table=np.zeros((num_seqs, num_pages), np.int32),
        kv_lens=np.zeros(num_seqs, np.int32), sample_idx=np.zeros(num_seqs, np.int32),
        swa_write_slots=np.zeros(num_tokens, np.int32) if hybrid else None,
        swa_page_table=np.zeros((num_seqs, num_pages), np.int32) if hybrid else None,
        page_size=page_size)


def padding_step_input(kv: KVCache, num_tokens: int, num_seqs: int, num_pages: int) -> StepInput:
    """An all-padding StepInput of exactly these bucket sizes (for warm-up compiles): writes go to slot 0."""
    meta = padding_meta(num_tokens, num_seqs, num_pages, page_size=kv.page_size, hybrid=kv.hybrid)
    return StepInput(np.zeros(num_tokens, np.int32), np.full(num_tokens, -1, np.int32), meta,
                     build_sampling_batch([], num_seqs))


def pad_to(x: np.ndarray | jax.Array, sizes: Sequence[int | None],
           value: int | float | bool = 0) -> np.ndarray:
    """`x` padded with `value` at the end of its last `len(sizes)` axes to those sizes (None: unchanged)."""
    x = np.asarray(x)
    lead = x.ndim - len(sizes)
    widths = [(0, 0)] * lead + [(0, 0 if n is None else n - d)
                                for n, d in zip(sizes, x.shape[lead:], strict=True)]
    return np.pad(x, widths, constant_values=value) if any(w for _, w in widths) else x


def pad_meta(meta: AttentionMetadata, num_tokens: int, num_seqs: int, num_pages: int) -> AttentionMetadata:
    """`meta` padded to a larger bucket exactly as `build_attention_metadata` pads: padding tokens at
    position 0 of sequence row 0 writing slot 0, padding rows with `kv_lens = 0` and zero page tables, page
    tables widened with page 0. Leading axes (a stack of metadata) are kept."""
    ps = meta.page_size

    def tokens(x):
        return None if x is None else pad_to(x, (num_tokens,))

    def rows(x):
        return pad_to(x, (num_seqs,))

    def table(x):
        return None if x is None else pad_to(x, (num_seqs, num_pages))

    mask = None if meta.custom_mask is None else pad_to(meta.custom_mask, (num_tokens, num_pages * ps), False)
    return AttentionMetadata(
        positions=tokens(meta.positions), seq_ids=tokens(meta.seq_ids), write_slots=tokens(meta.write_slots),
        page_table=table(meta.page_table), kv_lens=rows(meta.kv_lens), sample_idx=rows(meta.sample_idx),
        swa_write_slots=tokens(meta.swa_write_slots), swa_page_table=table(meta.swa_page_table),
        custom_mask=mask, page_size=ps)


def pad_sampling(batch: SamplingBatch, num_rows: int) -> SamplingBatch:
    """`batch` with greedy padding rows appended up to `num_rows` (the rows `build_sampling_batch` pads
    with; padding rows allow every token)."""
    extra = num_rows - batch.num_rows
    if extra == 0:
        return batch
    pad = build_sampling_batch([], extra)
    mask = batch.token_bitmask
    if mask is not None:
        mask = np.concatenate([np.asarray(mask), np.full((extra, mask.shape[1]), 0xFFFFFFFF, np.uint32)])
    joined = {f.name: np.concatenate([np.asarray(getattr(batch, f.name)), getattr(pad, f.name)])
              for f in dataclasses.fields(SamplingBatch) if f.name != "token_bitmask"}
    return SamplingBatch(**joined, token_bitmask=mask)


def step_bucket(inp: StepInput) -> tuple[int, int, int]:
    """(tokens, sequences, pages per sequence) of a built StepInput."""
    return inp.meta.num_tokens, inp.meta.num_seqs, inp.meta.page_table.shape[1]


def pad_step_input(inp: StepInput, num_tokens: int, num_seqs: int, num_pages: int) -> StepInput:
    """`inp` padded to the larger bucket (tokens, sequences, pages): as `build_step_input` pads, so every
    real row samples what it samples at its own bucket."""
    return StepInput(pad_to(inp.input_ids, (num_tokens,)), pad_to(inp.prev_rows, (num_tokens,), -1),
                     pad_meta(inp.meta, num_tokens, num_seqs, num_pages),
                     pad_sampling(inp.sampling, num_seqs))
