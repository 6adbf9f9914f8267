"""`shift.continue_round` (the overlapped schedule's on-device move, chains and trees alike) against the
brute-force reference: the same round planned on the host at each request's true start. A request flagged
`shifted` was planned `advance` tokens past its last computed position and its previous round accepted
`a` drafts, so it truly starts `a + 1` tokens on; the moved metadata (draft steps of `w` tokens each at
consecutive key indices with one rope position, and the verify span) must equal metadata built there, with
the same page table, padding tokens left writing the reserved slot 0 even when sequence 0's page table
fills the bucket; its last token and output counts are the previous round's."""

from __future__ import annotations

import jax
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxserve.layers.attention_metadata import SequenceStep, build_attention_metadata
from jaxserve.sampling import SamplingParams, SamplingRow, build_sampling_batch
from jaxserve.speculative.shift import continue_round


def _metas(starts, pages, *, ps, steps, w, nv, bucket, width):
    """Draft-step metadata stacked `[S-1, ...]` (None when S = 1) and the verify metadata, planned at
    `starts` as `round_plan` plans them."""
    seqs = (1, 2, 4, 8)
    meta = build_attention_metadata(
        [SequenceStep(nv, n + nv, p, p) for n, p in zip(starts, pages, strict=True)], page_size=ps,
        with_swa=True, token_buckets=tuple(b * nv for b in seqs if b >= bucket), seq_buckets=(bucket,),
        page_buckets=(width,))
    if steps == 1:
        return None, meta
    draft = [build_attention_metadata(
        [SequenceStep(w, n + s * w, p, positions=[n + s - 1] * w)
         for n, p in zip(starts, pages, strict=True)],
        page_size=ps, token_buckets=(bucket * w,), seq_buckets=(bucket,), page_buckets=(width,))
        for s in range(1, steps)]
    return jax.tree.map(lambda *xs: np.stack(xs), *draft), meta


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_continue_round_equals_the_plan_at_the_true_start(data):
    ps = data.draw(st.sampled_from([1, 4]))
    steps = data.draw(st.integers(1, 4))
    w = data.draw(st.integers(1, 3))
    nv = steps + 1 if w == 1 else data.draw(st.integers(2, 8))
    advance, reserve = min(steps, nv - 1) + 1, max(nv, (steps - 1) * w)
    k = data.draw(st.integers(1, 4))
    bucket = data.draw(st.sampled_from([b for b in (1, 2, 4, 8) if b >= k]))
    computed = data.draw(st.lists(st.integers(1, 30), min_size=k, max_size=k))
    shifted = data.draw(st.lists(st.booleans(), min_size=k, max_size=k))
    acc = data.draw(st.lists(st.integers(0, advance - 1), min_size=k, max_size=k))
    far = [n + advance * s for n, s in zip(computed, shifted, strict=True)]
    true = [n + (a + 1) * s for n, a, s in zip(computed, acc, shifted, strict=True)]
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    counts = [-(-(n + reserve) // ps) for n in far]
    ids = rng.permutation(np.arange(1, sum(counts) + 1)).astype(np.int32)  # page 0 stays reserved
    pages = np.split(ids, np.cumsum(counts)[:-1])
    width = max(counts)  # the longest sequence fills its page-table row
    planned = _metas(far, pages, ps=ps, steps=steps, w=w, nv=nv, bucket=bucket, width=width)
    expected = _metas(true, pages, ps=ps, steps=steps, w=w, nv=nv, bucket=bucket, width=width)

    rows = np.arange(bucket, dtype=np.int32)[::-1].copy()  # state rows, not the identity
    prev_acc, prev_last = np.zeros(8, np.int32), np.zeros(8, np.int32)
    prev_acc[rows[:k]], prev_last[rows[:k]] = acc, 100 + np.arange(k)
    flags = np.zeros(bucket, bool)
    flags[:k] = shifted
    last = np.full(bucket, 7, np.int32)
    done = rng.integers(0, 5, k)
    sampling = build_sampling_batch(
        [SamplingRow(SamplingParams(temperature=0.0), 0, int(g)) for g in done for _ in range(nv)],
        bucket * nv)
    got_last, got_draft, got_meta, got_sampling = continue_round(
        (prev_acc, prev_last), rows, flags, last, planned[0], planned[1], sampling, advance=advance)

    for got, want in zip(jax.tree.leaves((got_draft, got_meta)), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(np.asarray(got), want)
    assert np.asarray(got_last).tolist() == [100 + i if s else 7 for i, s in enumerate(shifted)] + \
        [7] * (bucket - k)
    generated = np.asarray(got_sampling.num_generated).reshape(bucket, nv)[:k, 0]
    assert generated.tolist() == [g + (a + 1) * s for g, a, s in zip(done, acc, shifted, strict=True)]
