"""`round_plan.draft_step_metadata` equals the generic `build_attention_metadata` of every draft step,
stacked, for chains and trees, page sizes 1 and 4, padded token and sequence buckets."""

from __future__ import annotations

import jax
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxserve.layers.attention_metadata import SequenceStep, build_attention_metadata, pick_bucket
from jaxserve.speculative.round_plan import draft_step_metadata

SEQ_BUCKETS = (1, 2, 4, 8)
TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


@settings(max_examples=80, deadline=None)
@given(starts=st.lists(st.integers(0, 40), min_size=1, max_size=8), steps=st.integers(2, 4),
       width=st.integers(1, 3), page_size=st.sampled_from([1, 4]), seed=st.integers(0, 2**16))
def test_draft_step_metadata_equals_the_generic_builder(starts, steps, width, page_size, seed):
    rng = np.random.default_rng(seed)
    reach = [n + steps * width for n in starts]  # every draft step's keys lie below this
    pages = [rng.permutation(np.arange(1, 200))[: -(-r // page_size) + int(rng.integers(0, 3))]
             for r in reach]
    width_bucket = max(len(p) for p in pages) + int(rng.integers(0, 4))
    num_tokens = pick_bucket(len(starts) * width, TOKEN_BUCKETS, "num_tokens")

    def generic(s):
        seqs = [SequenceStep(width, n + s * width, p, positions=[n + s - 1] * width)
                for n, p in zip(starts, pages, strict=True)]
        return build_attention_metadata(seqs, page_size=page_size, token_buckets=TOKEN_BUCKETS,
                                        seq_buckets=SEQ_BUCKETS, page_buckets=(width_bucket,))

    want = jax.tree.map(lambda *xs: np.stack(xs), *[generic(s) for s in range(1, steps)])
    got = draft_step_metadata(np.asarray(starts, np.int64), generic(1).page_table, steps=steps, width=width,
                              page_size=page_size, num_tokens=num_tokens)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for name in ("positions", "seq_ids", "write_slots", "page_table", "kv_lens", "sample_idx"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), name
