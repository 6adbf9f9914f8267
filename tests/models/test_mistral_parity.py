"""Mistral (sliding window on every layer, shorter than the sequence) vs transformers; paged runs."""

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


WINDOW = 8


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    path = tmp_path_factory.mktemp("mistral")
    hf = make_hf_checkpoint(path, "mistral", sliding_window=WINDOW, head_dim=16)
    return hf, Runner(load_model(path, progress=False)), path


def test_full_sequence_logits_match_transformers(mistral):
    hf, runner, _ = mistral
    assert runner.model.config.layer_types == ("sliding_attention",) * 2
    assert not runner.model.kv_layout.hybrid  # one pool group, window by masking
    ids = random_ids(40, 256, seed=1)
    assert rel_error(full_logits(runner, ids)[0], hf_logits(hf, ids)) <= TOLERANCE


def test_window_matters(mistral):
    hf, _, path = mistral
    no_window = load_variant(path, layer_types=("full_attention",) * 2, sliding_window=None)
    ids = random_ids(40, 256, seed=1)
    assert rel_error(full_logits(Runner(no_window), ids)[0], hf_logits(hf, ids)) > 100 * TOLERANCE


@pytest.mark.parametrize("page_size", [1, 16])
def test_paged_chunked_prefill_and_decode_match_full_forward(mistral, page_size):
    _, runner, _ = mistral
    seqs = [random_ids(37, 256, seed=3), random_ids(29, 256, seed=4)]
    paged = paged_logits(runner, seqs, [[5, 14, 6], [11, 2]], page_size=page_size)
    for seq, got in zip(seqs, paged, strict=True):
        assert rel_error(got, full_logits(runner, seq)[0]) <= PAGED_TOLERANCE
