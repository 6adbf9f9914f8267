"""`build_attention_metadata` against a per-token reference written in plain Python: every field of the
padded metadata (positions, sequence ids, write slots, page tables, kv lengths, sample rows), full and
sliding-window groups, position overrides, buckets, and the errors for steps it cannot describe."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxserve.layers.attention_metadata import SequenceStep, build_attention_metadata

BUCKETS = dict(token_buckets=(8, 32, 128), seq_buckets=(1, 2, 4, 8), page_buckets=(4, 8, 16, 64, 256))


def _bucket(n: int, buckets) -> int:
    return next(b for b in buckets if b >= n)


def _reference(steps, page_size: int, with_swa: bool) -> dict:
    """One token at a time, one table entry at a time: what each field must hold."""
    num_real = sum(s.num_new_tokens for s in steps)
    num_tokens = _bucket(num_real, BUCKETS["token_buckets"])
    num_seqs = _bucket(len(steps), BUCKETS["seq_buckets"])
    max_pages = _bucket(max(-(-s.kv_len // page_size) for s in steps), BUCKETS["page_buckets"])
    out = {name: [0] * num_tokens for name in ("positions", "seq_ids", "write_slots", "swa_write_slots")}
    out.update(page_table=[[0] * max_pages for _ in range(num_seqs)],
               swa_page_table=[[0] * max_pages for _ in range(num_seqs)],
               kv_lens=[0] * num_seqs, sample_idx=[0] * num_seqs)
    t = 0
    for s, step in enumerate(steps):
        for col, page in enumerate(step.page_ids):
            if col < max_pages:
                out["page_table"][s][col] = int(page)
        if with_swa:
            for i, page in enumerate(step.swa_page_ids):
                if step.swa_first_page + i < max_pages:
                    out["swa_page_table"][s][step.swa_first_page + i] = int(page)
        for j in range(step.num_new_tokens):
            key = step.kv_len - step.num_new_tokens + j
            out["positions"][t] = key if step.positions is None else int(step.positions[j])
            out["seq_ids"][t] = s
            out["write_slots"][t] = int(step.page_ids[key // page_size]) * page_size + key % page_size
            if with_swa:
                swa_page = step.swa_page_ids[key // page_size - step.swa_first_page]
                out["swa_write_slots"][t] = int(swa_page) * page_size + key % page_size
            t += 1
        out["kv_lens"][s] = step.kv_len
        out["sample_idx"][s] = t - 1
    return out


@st.composite
def _steps(draw):
    page_size = draw(st.sampled_from([1, 4, 16]))
    with_swa = draw(st.booleans())
    steps = []
    for _ in range(draw(st.integers(1, 8))):
        kv_len = draw(st.integers(1, 200))
        n = draw(st.integers(1, min(kv_len, 16)))
        pages_needed = -(-kv_len // page_size)
        pages = draw(st.lists(st.integers(1, 5000), min_size=pages_needed, max_size=pages_needed + 2))
        swa, lo = None, 0
        if with_swa:
            lo = draw(st.integers(0, (kv_len - n) // page_size))
            need = pages_needed - lo
            swa = draw(st.lists(st.integers(0, 5000), min_size=need, max_size=need + 1))
        positions = None
        if draw(st.booleans()):
            positions = draw(st.lists(st.integers(0, 10_000), min_size=n, max_size=n))
        steps.append(SequenceStep(n, kv_len, np.asarray(pages, np.int32), swa, positions, swa_first_page=lo))
    return page_size, with_swa, steps


@settings(max_examples=200, deadline=None)
@given(case=_steps())
def test_metadata_equals_the_per_token_reference(case) -> None:
    page_size, with_swa, steps = case
    if sum(s.num_new_tokens for s in steps) > BUCKETS["token_buckets"][-1]:
        return
    meta = build_attention_metadata(steps, page_size=page_size, with_swa=with_swa, **BUCKETS)
    want = _reference(steps, page_size, with_swa)
    for name in ("positions", "seq_ids", "write_slots", "page_table", "kv_lens", "sample_idx"):
        got = getattr(meta, name)
        assert got.dtype == np.int32, name
        np.testing.assert_array_equal(got, np.asarray(want[name], np.int32), err_msg=name)
    if with_swa:
        np.testing.assert_array_equal(meta.swa_page_table, np.asarray(want["swa_page_table"], np.int32))
        np.testing.assert_array_equal(meta.swa_write_slots, np.asarray(want["swa_write_slots"], np.int32))
    else:
        assert meta.swa_page_table is None and meta.swa_write_slots is None


def test_steps_it_cannot_describe_are_refused() -> None:
    ok = SequenceStep(2, 5, [3, 4], [7, 8], swa_first_page=0)
    with pytest.raises(ValueError, match=r"sequence 1: num_new_tokens=0"):
        build_attention_metadata([ok, SequenceStep(0, 5, [3, 4])], page_size=4)
    with pytest.raises(ValueError, match=r"sequence 1: num_new_tokens=6 must be in \[1, kv_len=5\]"):
        build_attention_metadata([ok, SequenceStep(6, 5, [3, 4])], page_size=4)
    with pytest.raises(ValueError, match=r"sequence 1: 1 pages of 4 .*cannot hold kv_len=5"):
        build_attention_metadata([ok, SequenceStep(1, 5, [3])], page_size=4)
    with pytest.raises(ValueError, match=r"sequence 1: swa_page_ids is required"):
        build_attention_metadata([ok, SequenceStep(1, 5, [3, 4])], page_size=4, with_swa=True)
    with pytest.raises(ValueError, match=r"sequence 0: swa_first_page=1 is past"):
        build_attention_metadata([SequenceStep(2, 5, [3, 4], [8], swa_first_page=1)], page_size=4,
                                 with_swa=True)
    with pytest.raises(ValueError, match=r"sequence 0: 1 swa pages of 4 from page 0 cannot hold kv_len=5"):
        build_attention_metadata([SequenceStep(1, 5, [3, 4], [8])], page_size=4, with_swa=True)
    with pytest.raises(ValueError, match="needs at least one sequence"):
        build_attention_metadata([], page_size=4)
