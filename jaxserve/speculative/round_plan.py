"""Planning a speculative round on the host: slots and step inputs, the same for chains and trees.

A round of a decoding request with `n = num_computed` and last token `x` drafts S - 1 steps of `w` tokens
each (w = 1 for a chain, the branching K for a tree) and verifies `num_verify` nodes. Its key indices:
- draft step s (1 .. S-1) writes its `w` scratch draft KV at key indices `n + (s-1)w .. n + sw - 1`, rope
  position `n + s - 1` (the draft trails the target by one position);
- the verify writes the target KV of its nodes at `n .. n + num_verify - 1` (the tree program replaces the
  rope positions and the mask on device; a chain's are the key indices) and the draft extend the draft KV
  at the same slots.
So a round needs `reserve = max(num_verify, (S-1)w)` slots from `n` on, all the request's own (allocated
here; the slots past the accepted end go back when the round is applied). A request whose previous round
is still in flight is planned as if that round advanced it the most it can (`advance`: see
`shift.continue_round`, which moves it back on device), so its slots reach `n + advance + reserve`.

Per verified node one sampling row with the request's output count before the round; the round programs add
each node's depth (and, when moved, what the previous round emitted) on device.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxserve.engine.kv_cache import KVCache
from jaxserve.engine.request import Request
from jaxserve.engine.step_input import pad_meta, pad_sampling, pad_to
from jaxserve.layers.attention_metadata import (
    AttentionMetadata,
    SequenceStep,
    build_attention_metadata,
    pick_bucket,
)
from jaxserve.memory.host_buffers import aligned_empty
from jaxserve.sampling import SamplingBatch, SamplingRow, build_sampling_batch


@dataclasses.dataclass(frozen=True)
class RoundPlan:
    """A planned round: its requests (verdict row order) and the same as a set (`members`: what the next
    round's plan treats as in flight), the program bucket (seqs, pages per sequence), and the device inputs
    padded to the seq bucket: state rows `i32[R]` (padding rows read row 0), destination rows `i32[R]`
    (padding rows: out of range, dropped), `shifted bool[R]` (planned as continuing the round in flight),
    last tokens `i32[R]`, the draft steps' metadata stacked `[S-1, ...]` (None when S = 1), the verify
    metadata and the sampling batch (`num_verify` rows per request)."""

    reqs: list[Request]
    members: frozenset
    bucket: tuple[int, int]
    state_rows: np.ndarray
    dest: np.ndarray
    shifted: np.ndarray
    last: np.ndarray
    draft_metas: AttentionMetadata | None
    meta: AttentionMetadata
    sampling: SamplingBatch

    @property
    def inputs(self) -> tuple:
        """The round program's per-round arguments, in its order (after state and embedding)."""
        return (self.state_rows, self.dest, self.shifted, self.last, self.draft_metas, self.meta,
                self.sampling)


class RoundPlanner:
    """Allocates and builds one round's inputs (module docstring) for a stepper's requests."""

    def __init__(self, kv: KVCache, *, num_steps: int, width: int, num_verify: int,
                 seq_buckets: tuple[int, ...], page_buckets: tuple[int, ...]) -> None:
        self.kv, self.num_steps, self.width, self.num_verify = kv, num_steps, width, num_verify
        self.seq_buckets, self.page_buckets = seq_buckets, page_buckets
        self.reserve = max(num_verify, (num_steps - 1) * width)
        self.advance = min(num_steps, num_verify - 1) + 1  # the most a round moves a request
        self.verify_tokens = tuple(b * num_verify for b in seq_buckets)
        self.draft_tokens = tuple(b * width for b in seq_buckets)

    def start(self, req: Request, in_flight: frozenset) -> int:
        """Where `req`'s next round starts on the host's books: past the round in flight's furthest reach
        when it is in it."""
        return req.num_computed + (self.advance if req in in_flight else 0)

    def plan(self, reqs: list[Request], state_rows: np.ndarray, num_state_rows: int,
             in_flight: frozenset) -> RoundPlan:
        """Allocate every request's slots up to `start + reserve` (room was made: failing is a bug) and build
        the round's inputs. `state_rows`: the requests' rows padded to the seq bucket; `num_state_rows`: the
        state buffer's size (the padding rows' destination); `in_flight`: the round in flight's requests."""
        kv, nv, steps, w = self.kv, self.num_verify, self.num_steps, self.width
        starts = [self.start(r, in_flight) for r in reqs]
        spans = [(r.cached, len(r.cached.kv_slots), n + self.reserve)
                 for r, n in zip(reqs, starts, strict=True)]
        if not kv.extend_many([s for s in spans if s[2] > s[1]]):
            raise RuntimeError("round allocation failed after room was made (a bug)")
        num_rows = state_rows.shape[0]
        shifted = np.zeros(num_rows, bool)
        shifted[: len(reqs)] = [r in in_flight for r in reqs]
        # SWA ids only where the window reaches, from the earliest start a move back can give
        swa_from = [kv.window_start(n - (self.advance if r in in_flight else 0))
                    for r, n in zip(reqs, starts, strict=True)]
        pages, swa = kv.page_ids_many([r.cached for r in reqs], [n + self.reserve for n in starts], swa_from)
        swa = swa if swa is not None else [None] * len(reqs)
        width = pick_bucket(max(p.shape[0] for p in pages), self.page_buckets, "pages_per_sequence")
        meta = build_attention_metadata(
            [SequenceStep(nv, n + nv, p, s, swa_first_page=kv.swa_first_page(a))
             for n, p, s, a in zip(starts, pages, swa, swa_from, strict=True)],
            page_size=kv.page_size, with_swa=kv.hybrid, token_buckets=self.verify_tokens,
            seq_buckets=self.seq_buckets, page_buckets=(width,))
        draft_metas = None
        if steps > 1:
            draft_metas = draft_step_metadata(np.asarray(starts, np.int64), meta.page_table, steps=steps,
                                              width=w, page_size=kv.page_size,
                                              num_tokens=pick_bucket(len(reqs) * w, self.draft_tokens,
                                                                     "num_tokens"))
        rows = [SamplingRow(r.params, r.seed, len(r.output_ids), r.penalty_row) for r in reqs]
        dest = np.full(num_rows, num_state_rows, np.int32)
        dest[: len(reqs)] = state_rows[: len(reqs)]
        last = np.zeros(num_rows, np.int32)
        last[: len(reqs)] = [r.output_ids[-1] for r in reqs]
        return RoundPlan(reqs, frozenset(reqs), (num_rows, width), state_rows, dest, shifted, last,
                         draft_metas, meta, build_sampling_batch(rows, meta.num_tokens, repeat=nv))


def draft_step_metadata(starts: np.ndarray, page_table: np.ndarray, *, steps: int, width: int, page_size: int,
                        num_tokens: int) -> AttentionMetadata:
    """The round's draft steps' metadata stacked `[steps - 1, ...]` (full group only): at draft step s
    (1 .. steps-1) request i feeds `width` tokens at key indices `starts[i] + (s-1) width ..` and rope
    position `starts[i] + s - 1`, through `page_table` (the verify's: the same pages, bucket and width).
    Equal to `build_attention_metadata` of those steps, built at once with numpy: O(steps x tokens)."""
    num_seqs, n = page_table.shape[0], starts.shape[0]
    step = np.arange(1, steps)[:, None, None]  # [S-1, 1, 1]
    k = np.arange(width)[None, None, :]  # [1, 1, w]
    start = starts[None, :, None]  # [1, n, 1]
    keys = (start + (step - 1) * width + k).reshape(steps - 1, n * width)
    rows = np.repeat(np.arange(n), width)
    real = n * width
    positions = np.zeros((steps - 1, num_tokens), np.int32)
    positions[:, :real] = np.broadcast_to(start + step - 1, (steps - 1, n, width)).reshape(steps - 1, real)
    seq_ids = np.zeros((steps - 1, num_tokens), np.int32)
    seq_ids[:, :real] = rows
    write_slots = np.zeros((steps - 1, num_tokens), np.int32)
    pages = page_table[rows, keys // page_size].astype(np.int64)
    write_slots[:, :real] = pages * page_size + keys % page_size
    kv_lens = np.zeros((steps - 1, num_seqs), np.int32)
    kv_lens[:, :n] = starts[None, :] + np.arange(1, steps)[:, None] * width
    sample_idx = np.zeros((steps - 1, num_seqs), np.int32)
    sample_idx[:, :n] = np.arange(1, n + 1) * width - 1
    tables = aligned_empty((steps - 1, *page_table.shape), page_table.dtype)  # uncopied by a CPU step
    tables[...] = page_table
    return AttentionMetadata(positions=positions, seq_ids=seq_ids, write_slots=write_slots, page_table=tables,
                             kv_lens=kv_lens, sample_idx=sample_idx, page_size=page_size)


def repad_round(args: tuple, bucket: tuple[int, int]) -> tuple:
    """A round program's arguments (state, shifts and embedding, then `RoundPlan.inputs`) padded to the
    bucket (seqs, pages): padding requests read state row 0, store nothing (out-of-range row), are not
    shifted and verify greedy padding rows."""
    s, p = bucket
    states, (state_rows, dest, shifted, last, draft_metas, meta, sampling) = args[5], args[8:]
    nodes = meta.num_tokens // state_rows.shape[0]
    if draft_metas is not None:
        width = draft_metas.positions.shape[-1] // state_rows.shape[0]
        draft_metas = pad_meta(draft_metas, s * width, s, p)
    return (*args[:8], pad_to(state_rows, (s,)), pad_to(dest, (s,), states[0].shape[0]),
            pad_to(shifted, (s,), False), pad_to(last, (s,)), draft_metas,
            pad_meta(meta, s * nodes, s, p), pad_sampling(sampling, s * nodes))
