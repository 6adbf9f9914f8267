"""Qwen2 (q/k/v biases; `use_sliding_window` + `max_window_layers` making a hybrid model) vs transformers."""

import numpy as np
import pytest

from jaxserve.loader.load import load_model
from tests.models.helpers import (
    PAGED_TOLERANCE,
    TOLERANCE,
    Runner,
    full_logits,
    hf_logits,
    load_variant,
    make_hf_checkpoint,
    paged_logits,
    random_ids,
    rel_error,
)

pytestmark = [pytest.mark.hf, pytest.mark.slow]


WINDOW = 6


@pytest.fixture(scope="module")
def qwen2_dense(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen2")
    hf = make_hf_checkpoint(path, "qwen2")
    return hf, Runner(load_model(path, progress=False))


@pytest.fixture(scope="module")
def qwen2_swa(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen2_swa")
    hf = make_hf_checkpoint(path, "qwen2", num_hidden_layers=3, use_sliding_window=True,
                            sliding_window=WINDOW, max_window_layers=1)
    return hf, Runner(load_model(path, progress=False)), path


def test_dense_logits_match_transformers(qwen2_dense):
    hf, runner = qwen2_dense
    assert runner.model.attention_config(0).qkv_bias and not runner.model.attention_config(0).o_bias
    ids = random_ids(40, 256, seed=1)
    assert rel_error(full_logits(runner, ids)[0], hf_logits(hf, ids)) <= TOLERANCE


def test_sliding_layers_from_max_window_layers_match_transformers(qwen2_swa):
    hf, runner, _ = qwen2_swa
    cfg = runner.model.config
    assert cfg.layer_types == ("full_attention", "sliding_attention", "sliding_attention")
    assert runner.model.kv_layout.swa_layer_ids == (1, 2)
    ids = random_ids(40, 256, seed=1)
    assert rel_error(full_logits(runner, ids)[0], hf_logits(hf, ids)) <= TOLERANCE


def test_window_matters(qwen2_swa):
    hf, _, path = qwen2_swa
    no_window = load_variant(path, layer_types=("full_attention",) * 3, sliding_window=None)
    ids = random_ids(40, 256, seed=1)
    assert rel_error(full_logits(Runner(no_window), ids)[0], hf_logits(hf, ids)) > 100 * TOLERANCE


@pytest.mark.parametrize("page_size", [1, 16])
def test_paged_hybrid_pools_with_evicted_swa_pages_match_full_forward(qwen2_swa, page_size):
    _, runner, _ = qwen2_swa
    seqs = [random_ids(39, 256, seed=3), random_ids(28, 256, seed=4)]
    paged = paged_logits(runner, seqs, [[10, 3, 8], [6, 9]], page_size=page_size, window=WINDOW)
    for seq, got in zip(seqs, paged, strict=True):
        assert rel_error(got, full_logits(runner, seq)[0]) <= PAGED_TOLERANCE


def test_hybrid_model_also_runs_on_a_single_pool_group(qwen2_swa):
    """Sliding layers may live in the full group too (the window is then applied by masking only)."""
    from jaxserve.layers.attention_metadata import SequenceStep, build_attention_metadata
    from jaxserve.memory.kv_pool import make_kv_pool

    _, runner, _ = qwen2_swa
    ids = random_ids(40, 256, seed=1)
    cfg = runner.model.config
    pool = make_kv_pool(cfg.num_layers, 40, 1, cfg.num_kv_heads, cfg.head_dim, np.float32)
    meta = build_attention_metadata([SequenceStep(40, 40, list(range(1, 41)))], page_size=1)
    tokens = np.zeros(meta.num_tokens, np.int32)
    tokens[:40] = ids
    logits, _, _ = runner.forward(runner.params, tokens, meta, pool, return_all_logits=True)
    assert rel_error(np.asarray(logits)[:40], full_logits(runner, ids)[0]) <= PAGED_TOLERANCE
