"""`pad_step_input` pads a built step exactly as `build_step_input` pads at the larger bucket (the padded
fallback of `runner.Programs` relies on it): same arrays, field by field, with and without an SWA group, at
page sizes 1 and 4; padding rows of a grammar mask allow every token."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from jaxserve.engine.kv_cache import KVCache
from jaxserve.engine.request import make_request
from jaxserve.engine.step_input import Buckets, ScheduledSeq, build_step_input, pad_sampling, pad_step_input
from jaxserve.models.config import ModelConfig
from jaxserve.sampling import SamplingParams
from tests.engine.conftest import GPT_OSS

LLAMA = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=64, hidden_size=32,
             intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=256)
GPT = dict(architectures=["GptOssForCausalLM"], model_type="gpt_oss", vocab_size=64, hidden_size=32,
           num_attention_heads=4, num_key_value_heads=2, layer_types=["sliding_attention", "full_attention",
                                                                       "sliding_attention"], **GPT_OSS)


def _batch(kv: KVCache, lengths: list[int]) -> list[ScheduledSeq]:
    seqs = []
    for i, n in enumerate(lengths):
        params = SamplingParams(temperature=0.7 if i % 2 else 0.0, top_k=5 if i % 2 else -1)
        req = make_request(f"r{i}", np.arange(1, n + 1, dtype=np.int32) % 60, params, tree_root=kv.tree.root,
                           seed=i)
        assert kv.extend_many([(req.cached, 0, n)])
        req.num_pending = int(i != 1)  # the step's own sample
        seqs.append(ScheduledSeq(req, 0, n, samples=i != 1))
    return seqs


@pytest.mark.parametrize("config", [LLAMA, GPT], ids=["llama", "gpt_oss"])
@pytest.mark.parametrize("page_size", [1, 4])
def test_padding_a_built_step_equals_building_it_at_the_larger_bucket(config, page_size):
    kv = KVCache(ModelConfig.from_dict(config), num_pages=256 // page_size, page_size=page_size,
                 kv_dtype=np.float32, disable_radix_cache=True)
    small = Buckets(tokens=(16,), seqs=(4,), pages=(-(-24 // page_size),))
    large = Buckets(tokens=(64,), seqs=(8,), pages=(-(-96 // page_size),))
    seqs = _batch(kv, [5, 9, 1])
    exact = build_step_input(seqs, kv, large)
    padded = pad_step_input(build_step_input(seqs, kv, small), 64, 8, large.pages[0])
    for path, a in jax.tree_util.tree_leaves_with_path(exact):
        b = dict(jax.tree_util.tree_leaves_with_path(padded))[path]
        assert np.asarray(a).dtype == np.asarray(b).dtype, path
        np.testing.assert_array_equal(a, b, err_msg=str(path))
    assert jax.tree.structure(exact) == jax.tree.structure(padded)


def test_padding_rows_of_a_grammar_mask_allow_every_token():
    from jaxserve.sampling import SamplingRow, build_sampling_batch

    rows = [SamplingRow(SamplingParams(temperature=0.0), 0, 0, None)] * 2
    mask = np.array([[1, 2], [3, 4]], np.uint32)
    exact, padded = build_sampling_batch(rows, 4, mask), pad_sampling(build_sampling_batch(rows, 2, mask), 4)
    for field in dataclasses.fields(exact):
        np.testing.assert_array_equal(getattr(exact, field.name), getattr(padded, field.name))
