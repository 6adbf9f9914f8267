"""Qwen3 (per-head q/k RMSNorm, head_dim independent of hidden/heads) vs transformers; paged runs."""

import pytest

from jaxserve.loader.load import load_model
from tests.models.helpers import (
    PAGED_TOLERANCE,
    TOLERANCE,
    Runner,
    full_logits,
    hf_logits,
    make_hf_checkpoint,
    paged_logits,
    random_ids,
    rel_error,
)

pytestmark = [pytest.mark.hf, pytest.mark.slow]


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3")
    hf = make_hf_checkpoint(path, "qwen3", head_dim=32, num_hidden_layers=2)
    return hf, Runner(load_model(path, progress=False))


def test_full_sequence_logits_match_transformers(qwen3):
    hf, runner = qwen3
    assert runner.model.config.head_dim == 32
    ids = random_ids(40, 256, seed=1)
    assert rel_error(full_logits(runner, ids)[0], hf_logits(hf, ids)) <= TOLERANCE


@pytest.mark.parametrize("page_size", [1, 16])
def test_paged_chunked_prefill_and_decode_match_full_forward(qwen3, page_size):
    _, runner = qwen3
    seqs = [random_ids(33, 256, seed=3), random_ids(26, 256, seed=4)]
    paged = paged_logits(runner, seqs, [[9, 4], [2, 17]], page_size=page_size)
    for seq, got in zip(seqs, paged, strict=True):
        assert rel_error(got, full_logits(runner, seq)[0]) <= PAGED_TOLERANCE
