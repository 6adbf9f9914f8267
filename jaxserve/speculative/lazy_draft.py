"""Deferred draft extends: plain decode steps under EAGLE-3 that cost what a plain-engine step costs.

A plain step under EAGLE-3 must leave the draft usable for a later round: the draft's KV at every decoded
position, and its state (best next tokens, hidden state) at the last one. Extending the draft in the plain
step itself costs a draft layer per step (~10-20% of a plain step on the embedded model). Instead the plain
step here runs the target only and keeps what a later extend needs and cannot recompute cheaply: the
target's captured hidden states (`aux`) at the decoded position, in a per-request ring of `ring` positions
(`AuxRing`, one row per draft-state row, position p at column p % ring). The tokens are on the host. The
draft then catches up over all deferred positions at once (`catch_up`: one ragged extend, exactly the
extend the plain steps would have run, position p fed token p + 1 with the target's state at p):
- before a round, for the requests that lag (switching back to rounds stays lossless and keeps the
  draft's acceptance);
- before a plain step that would overwrite a ring column still needed (every `ring` plain steps), over
  the positions whose next token is on the host, without waiting for the step in flight;
- when lagging requests finish: their spans are read as the scheduler finishes them (before their slots
  go to the prefix tree) and extended together right after, before anything can reuse those slots, so
  the draft KV the tree caches is the draft KV the round path would have left.
A retracted request's decoded positions are not cached (its prefill recomputes them, draft included), and
an aborted one's are freed: both just drop their lag.

When plain steps have won at the running batch size, a request may drop its draft instead
(`DraftLag.detach`): a catch-up only pays if a round comes back, and on a small model a one-layer extend
is a large share of a step (~8-11% of a plain step at 32-64 requests, figures below). It then takes plain
steps to its end, and the prefix tree caches it only up to the first position without draft KV: a later
request that reuses a cached prefix always finds the draft KV rounds need there.

`DraftLag` is the host's record: per lagging request, the first position whose draft KV is missing.

Cost, measured on the embedded model (CPU, device programs alone, same run): the deferred plain step
costs what the plain engine's step costs (5.69 vs 5.67 ms at 32 requests, 9.28 vs 9.38 ms at 64); a
catch-up over 16 positions of 32 (64) requests costs 7.1 (16.2) ms, ~0.45 ms per plain step (the extend
inside each plain step cost ~1.1 ms at 32). The catch-ups are the rest of the gap to the plain engine.
(Those catch-up figures predate `Eagle3Draft.extend`, which runs the layer over each request's last
position only and writes the K/V of the others: a catch-up now costs the fc and K/V projections of its
positions plus one layer per request.)
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxserve.engine.kv_cache import KVCache
from jaxserve.engine.program_cache import program_factory
from jaxserve.engine.request import Request
from jaxserve.engine.runner import Bucket, Programs
from jaxserve.engine.step_input import StepInput, pad_meta, pad_step_input, pad_to
from jaxserve.layers.attention_metadata import SequenceStep, build_attention_metadata, pick_bucket
from jaxserve.sampling import sample, update_counts
from jaxserve.speculative.draft_state import extend_and_store


class DraftLag:
    """Which decoding requests' draft trails the target, and from which position (`since[req]`: the
    first position without draft KV; the target has computed up to `req.num_computed`), and which have
    dropped their draft for good (`detached[req]`: the first position without draft KV, which stays so:
    such a request takes plain steps only, no catch-up runs for it, and the prefix tree caches its
    positions before that one only)."""

    def __init__(self, ring: int) -> None:
        self.ring = ring
        self.since: dict[Request, int] = {}
        self.detached: dict[Request, int] = {}

    def __contains__(self, req: Request) -> bool:
        return req in self.since

    def defer(self, reqs: list[Request]) -> None:
        """`reqs` are about to take a deferred plain step (before their `num_computed` moves on)."""
        for req in reqs:
            if req not in self.detached:
                self.since.setdefault(req, req.num_computed)

    def detach(self, reqs: list[Request]) -> int:
        """Drop `reqs`' drafts: what a catch-up would still need is forgotten, and their later plain steps
        keep nothing for the draft (see the class). Returns how many had a draft until now."""
        fresh = [r for r in reqs if r not in self.detached]
        for req in fresh:
            self.detached[req] = self.since.pop(req, req.num_computed)
        return len(fresh)

    def lagging(self, reqs: list[Request]) -> list[Request]:
        return [r for r in reqs if r in self.since]

    def ring_full(self, reqs: list[Request]) -> bool:
        """Whether another deferred step for `reqs` would overwrite a ring column a catch-up still needs."""
        return any(r.num_computed - self.since[r] >= self.ring for r in reqs if r in self.since)

    def forget(self, req: Request) -> None:
        self.since.pop(req, None)
        self.detached.pop(req, None)


@program_factory(maxsize=16)
def make_lazy_programs(tgraph, dgraph, topk: int, max_seqs: int, ring: int) -> tuple[Programs, Programs]:
    """(`plain_capture`, `catch_up`) for one (target, draft) graph pair.

    `plain_capture(tparams, pools, penalties, aux_ring, prev_tokens, prev_rows, input_ids, meta, sampling,
    dest)`: the plain engine's step (target, sampling, penalty counts; pending tokens read from
    `prev_tokens` at `prev_rows`) that also writes each sequence's captured state at its sampled position p
    into `aux_ring[dest, p % ring]` (out-of-range `dest`: dropped). Returns (pools, penalties, aux_ring,
    next_tokens padded to `max_seqs`, samples).

    `catch_up(dparams, dpool, states, emb, aux_ring, ids, meta, rows)`: the draft extend over ragged spans
    (span s is request row `rows[s]`: its token at position p reads `aux_ring[rows[s], p % ring]` and is fed
    `ids`, the token after p), storing each span's last state at `states` row `rows[s]` (out of range:
    padding, dropped). Returns (dpool, states)."""

    @functools.partial(jax.jit, donate_argnames=("pools", "penalties", "aux_ring"))
    def plain_capture(tparams, pools, penalties, aux_ring, prev_tokens, prev_rows, input_ids, meta, sampling,
                      dest):
        input_ids = jnp.where(prev_rows >= 0, prev_tokens[jnp.maximum(prev_rows, 0)], input_ids)
        logits, pools, aux = nnx.merge(tgraph, tparams)(input_ids, meta, pools)
        out = sample(logits, sampling, penalties)
        penalties = update_counts(penalties, sampling.penalty_rows, out.token_ids)
        column = meta.positions[meta.sample_idx] % ring
        aux_ring = aux_ring.at[dest, column].set(aux[meta.sample_idx].astype(aux_ring.dtype), mode="drop")
        next_tokens = jnp.zeros(max_seqs, jnp.int32).at[: out.token_ids.shape[0]].set(out.token_ids)
        return pools, penalties, aux_ring, next_tokens, out

    @functools.partial(jax.jit, donate_argnames=("dpool", "states"))
    def catch_up(dparams, dpool, states, emb, aux_ring, ids, meta, rows):
        token_rows = jnp.minimum(rows[meta.seq_ids], aux_ring.shape[0] - 1)  # padding reads the last row
        hidden = aux_ring[token_rows, meta.positions % ring]
        dpool, states, _ = extend_and_store(nnx.merge(dgraph, dparams), ids, hidden, meta, dpool, emb, states,
                                            rows, meta.sample_idx, topk=topk, record=False)
        return dpool, states

    return (Programs(plain_capture, "plain_capture", fixed=(0,)),
            Programs(catch_up, "catch_up", fixed=(0, 3)))


def repad_plain_capture(args: tuple, bucket: Bucket) -> tuple:
    """`plain_capture`'s arguments padded to the bucket (tokens, seqs, pages) as `build_step_input` pads;
    padding rows write no ring column (out-of-range `dest`)."""
    t, s, p = bucket
    aux_ring, (prev_rows, input_ids, meta, sampling, dest) = args[3], args[5:]
    inp = pad_step_input(StepInput(input_ids, prev_rows, meta, sampling), t, s, p)
    return (*args[:5], inp.prev_rows, inp.input_ids, inp.meta, inp.sampling,
            pad_to(dest, (s,), aux_ring.shape[0]))


def repad_catch_up(args: tuple, bucket: Bucket) -> tuple:
    """`catch_up`'s arguments padded to the bucket (tokens, seqs, pages): padding rows store nothing
    (out-of-range row)."""
    t, s, p = bucket
    states, (ids, meta, rows) = args[2], args[5:]
    return (*args[:5], pad_to(ids, (t,)), pad_meta(meta, t, s, p), pad_to(rows, (s,), states[0].shape[0]))


@dataclasses.dataclass(frozen=True)
class Span:
    """Deferred draft positions of one request: `[start, start + len(ids))`, fed `ids` (each position's
    next token), reading ring row `row`, over the full-group pages `page_ids` (they cover the span)."""

    row: int
    start: int
    ids: np.ndarray
    page_ids: np.ndarray


def take_spans(lag: DraftLag, reqs: list[Request], rows: list[int], kv: KVCache) -> list[Span]:
    """The lagging `reqs`' deferred spans (`rows[i]`: request i's ring row), read now (while they hold
    their slots). A span covers positions `[since, end)`, `end = min(num_computed, tokens on the host - 1)`:
    every position with target KV whose next token is known; empty ones are left out. `lag` keeps what
    is left (`since = end`: a position whose next token is still in flight on device)."""
    since = [lag.since.pop(r) for r in reqs]
    ends = [min(r.num_computed, int(r.prompt_ids.shape[0]) + len(r.output_ids) - 1) for r in reqs]
    for req, start, end in zip(reqs, since, ends, strict=True):
        if req.num_computed > max(start, end):
            lag.since[req] = max(start, end)
    kept = [i for i, (e, s) in enumerate(zip(ends, since, strict=True)) if e > s]
    if not kept:
        return []
    pages, _ = kv.page_ids_many([reqs[i].cached for i in kept], [ends[i] for i in kept])
    return [Span(rows[i], since[i], reqs[i].fill_ids()[since[i] + 1: ends[i] + 1], p)
            for i, p in zip(kept, pages, strict=True)]


def catch_up_input(spans: list[Span], *, ring: int, page_size: int, num_rows: int, seq_buckets,
                   page_buckets) -> tuple:
    """`catch_up`'s host arguments (ids, meta, rows) for `spans` (non-empty, each at most `ring` long),
    padding rows at the out-of-range row `num_rows`. The tokens are padded to `ring` per sequence of the
    sequence bucket, so one program per (sequences, pages) bucket serves every lag."""
    seqs = pick_bucket(len(spans), seq_buckets, "num_seqs")
    steps = [SequenceStep(len(s.ids), s.start + len(s.ids), s.page_ids) for s in spans]
    meta = build_attention_metadata(steps, page_size=page_size, token_buckets=(seqs * ring,),
                                    seq_buckets=(seqs,), page_buckets=page_buckets)
    ids = pad_to(np.concatenate([s.ids for s in spans]).astype(np.int32), (meta.num_tokens,))
    rows = np.full(meta.num_seqs, num_rows, np.int32)
    rows[: len(spans)] = [s.row for s in spans]
    return ids, meta, rows
