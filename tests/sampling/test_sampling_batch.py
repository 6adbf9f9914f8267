"""build_sampling_batch packs rows and neutral padding; seeds map to threefry keys as documented."""

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxserve.sampling import (
    NO_PENALTY_ROW,
    SamplingParams,
    SamplingRow,
    SeedSource,
    build_sampling_batch,
    row_keys,
    seed_words,
)


def test_rows_are_packed_in_order_and_padding_is_neutral_greedy():
    rows = [
        SamplingRow(SamplingParams(temperature=0.5, top_k=7, top_p=0.9, min_p=0.1), seed=3, num_generated=4),
        SamplingRow(
            SamplingParams(temperature=1e-7, repetition_penalty=1.2), seed=-1, num_generated=0, penalty_row=5
        ),
    ]
    batch = build_sampling_batch(rows, 4)
    assert batch.num_rows == 4
    np.testing.assert_array_equal(batch.temperatures, np.array([0.5, 0.0, 0.0, 0.0], np.float32))
    np.testing.assert_array_equal(batch.top_k, [7, -1, -1, -1])
    np.testing.assert_array_equal(batch.top_p, np.array([0.9, 1, 1, 1], np.float32))
    np.testing.assert_array_equal(batch.min_p, np.array([0.1, 0, 0, 0], np.float32))
    np.testing.assert_array_equal(batch.repetition_penalty, np.array([1, 1.2, 1, 1], np.float32))
    np.testing.assert_array_equal(batch.frequency_penalty, 0)
    np.testing.assert_array_equal(batch.presence_penalty, 0)
    np.testing.assert_array_equal(batch.num_generated, [4, 0, 0, 0])
    np.testing.assert_array_equal(batch.penalty_rows, [NO_PENALTY_ROW, 5, NO_PENALTY_ROW, NO_PENALTY_ROW])
    np.testing.assert_array_equal(batch.seed_words, [[0, 3], [0xFFFFFFFF, 0xFFFFFFFF], [0, 0], [0, 0]])
    dtypes = {
        name: getattr(batch, name).dtype for name in ("temperatures", "top_k", "seed_words", "penalty_rows")
    }
    assert dtypes == {
        "temperatures": np.float32,
        "top_k": np.int32,
        "seed_words": np.uint32,
        "penalty_rows": np.int32,
    }


def test_huge_top_k_is_clamped_to_int32():
    batch = build_sampling_batch([SamplingRow(SamplingParams(top_k=1 << 40), 0, 0)], 1)
    assert batch.top_k[0] == np.iinfo(np.int32).max


def test_too_many_rows_or_negative_num_generated_raise():
    row = SamplingRow(SamplingParams(), 0, 0)
    with pytest.raises(ValueError, match="3 sampling rows do not fit the bucket of 2 rows"):
        build_sampling_batch([row] * 3, 2)
    with pytest.raises(ValueError, match="num_generated"):
        build_sampling_batch([SamplingRow(SamplingParams(), 0, -1)], 2)
    with pytest.raises(
        ValueError, match="uses repetition/frequency/presence penalties but has no penalty_row"
    ):
        build_sampling_batch([SamplingRow(SamplingParams(presence_penalty=0.1), 0, 0)], 2)


def test_seed_words_split_64_bits_high_then_low():
    np.testing.assert_array_equal(
        seed_words([0, 1, (5 << 32) | 9, -2, 1 << 64]),
        [[0, 0], [0, 1], [5, 9], [0xFFFFFFFF, 0xFFFFFFFE], [0, 0]],
    )


def test_row_key_is_fold_in_of_the_seed_key_and_num_generated():
    rows = [
        SamplingRow(SamplingParams(), seed=42, num_generated=7),
        SamplingRow(SamplingParams(), 5 << 32, 0),
    ]
    keys = jax.random.key_data(row_keys(build_sampling_batch(rows, 2)))
    want0 = jax.random.key_data(jax.random.fold_in(jax.random.PRNGKey(42), 7))
    np.testing.assert_array_equal(keys[0], want0)
    want1 = jax.random.key_data(jax.random.fold_in(jax.random.wrap_key_data(np.array([5, 0], np.uint32)), 0))
    np.testing.assert_array_equal(keys[1], want1)


def test_seed_source_is_repeatable_distinct_and_respects_explicit_seeds():
    source = SeedSource(base_seed=9)
    seeds = [source.next_seed() for _ in range(1000)]
    assert SeedSource(base_seed=9).next_seed() == seeds[0] and len(set(seeds)) == 1000
    assert all(0 <= seed < 1 << 64 for seed in seeds)
    assert SeedSource(base_seed=10).next_seed() != seeds[0]
    assert source.seed_for(SamplingParams(seed=77)) == 77
    replay = SeedSource(base_seed=9)
    for _ in range(1000):
        replay.next_seed()
    assert source.seed_for(SamplingParams()) == replay.next_seed()


def test_repeated_rows_equal_the_rows_written_out():
    """`repeat=k` fills k consecutive rows per row: the batch equals the one built from every row written
    out k times (the padding rows past them too)."""
    params = st.builds(SamplingParams, temperature=st.sampled_from([0.0, 0.7]),
                       top_k=st.sampled_from([-1, 5]), top_p=st.sampled_from([1.0, 0.8]),
                       frequency_penalty=st.sampled_from([0.0, 0.5]),
                       logit_bias=st.sampled_from([None, {3: 1.5, 9: -2.0}]),
                       top_logprobs_num=st.sampled_from([0, 2]))
    row = st.builds(SamplingRow, params=params, seed=st.integers(-2**40, 2**40),
                    num_generated=st.integers(0, 50), penalty_row=st.just(1))

    @settings(max_examples=40, deadline=None)
    @given(rows=st.lists(row, max_size=4), repeat=st.integers(1, 4), spare=st.integers(0, 3))
    def check(rows, repeat, spare):
        num_rows = len(rows) * repeat + spare
        got = build_sampling_batch(rows, num_rows, repeat=repeat)
        want = build_sampling_batch([r for r in rows for _ in range(repeat)], num_rows)
        for name in got.__dataclass_fields__:
            a, b = getattr(got, name), getattr(want, name)
            assert (a is None and b is None) or (a.dtype == b.dtype and np.array_equal(a, b)), name

    check()


def test_every_row_holds_its_params_as_the_contract_says():
    """Against a per-row reference written from `SamplingBatch`'s contract: a greedy row (temperature below
    1e-5) carries temperature 0 and its three filters off, top_k is capped at the int32 maximum, and the
    penalties, num_generated, penalty row and top-logprob count are the row's own; padding rows are
    neutral. Also holds for params objects shared by several rows (each computes its values once)."""
    int32_max = int(np.iinfo(np.int32).max)
    params = st.builds(SamplingParams, temperature=st.sampled_from([0.0, 1e-6, 0.3, 1.0, 2.5]),
                       top_k=st.sampled_from([-1, 1, 40, 1 << 40]), top_p=st.sampled_from([1.0, 0.95, 0.1]),
                       min_p=st.sampled_from([0.0, 0.05]), repetition_penalty=st.sampled_from([1.0, 1.3]),
                       frequency_penalty=st.sampled_from([0.0, -0.4]),
                       presence_penalty=st.sampled_from([0.0, 0.7]),
                       top_logprobs_num=st.integers(0, 20))

    def reference(row: SamplingRow) -> dict:
        p = row.params
        greedy = p.temperature < 1e-5
        return {"temperatures": 0.0 if greedy else np.float32(p.temperature),
                "top_k": -1 if greedy else min(p.top_k, int32_max),
                "top_p": 1.0 if greedy else np.float32(p.top_p),
                "min_p": 0.0 if greedy else np.float32(p.min_p),
                "repetition_penalty": np.float32(p.repetition_penalty),
                "frequency_penalty": np.float32(p.frequency_penalty),
                "presence_penalty": np.float32(p.presence_penalty),
                "num_generated": row.num_generated,
                "penalty_rows": NO_PENALTY_ROW if row.penalty_row is None else row.penalty_row,
                "num_top_logprobs": p.top_logprobs_num}

    padding = {"temperatures": 0.0, "top_k": -1, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0,
               "frequency_penalty": 0.0, "presence_penalty": 0.0, "num_generated": 0,
               "penalty_rows": NO_PENALTY_ROW, "num_top_logprobs": 0}

    @settings(max_examples=60, deadline=None)
    @given(shared=st.lists(params, min_size=1, max_size=3), picks=st.lists(st.integers(0, 2), max_size=6),
           data=st.data(), spare=st.integers(0, 3))
    def check(shared, picks, data, spare):
        rows = []
        for k in picks:
            p = shared[k % len(shared)]
            rows.append(SamplingRow(p, data.draw(st.integers(0, 2**40)), data.draw(st.integers(0, 99)),
                                    data.draw(st.sampled_from([None, 0, 7])) if not p.uses_penalties else 3))
        batch = build_sampling_batch(rows, len(rows) + spare)
        for i in range(len(rows) + spare):
            want = reference(rows[i]) if i < len(rows) else padding
            got = {name: getattr(batch, name)[i].item() for name in want}
            assert got == {name: np.asarray(v).item() for name, v in want.items()}, i

    check()
