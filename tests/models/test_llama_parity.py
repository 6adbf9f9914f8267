"""Llama (llama3 rope scaling) vs transformers: full-sequence logits, EAGLE-3 aux hidden, paged runs."""

import pytest

from jaxserve.layers.rotary import RopeParams
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


LLAMA3_ROPE = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=16)  # wavelengths > 16 positions get scaled
AUX_LAYERS = (0, 1)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    hf = make_hf_checkpoint(path, "llama", num_hidden_layers=3, rope_scaling=LLAMA3_ROPE, attention_bias=True,
                            mlp_bias=True)  # biases on q/k/v/o and the MLP, perturbed away from zero
    model = load_model(path, progress=False, aux_hidden_state_layer_ids=AUX_LAYERS)
    return hf, Runner(model), path


def test_full_sequence_logits_match_transformers(llama):
    hf, runner, _ = llama
    assert runner.model.config.rope_for(0).rope_type == "llama3"
    ids = random_ids(45, 256, seed=1)
    ours, _ = full_logits(runner, ids)
    assert rel_error(ours, hf_logits(hf, ids)) <= TOLERANCE


def test_llama3_rope_scaling_matters(llama):
    hf, _, path = llama
    plain = load_variant(path, rope=(("full_attention", RopeParams(theta=10000.0)),))
    ids = random_ids(45, 256, seed=1)
    assert rel_error(full_logits(Runner(plain), ids)[0], hf_logits(hf, ids)) > 100 * TOLERANCE


def test_aux_hidden_states_are_outputs_of_the_listed_layers(llama):
    hf, runner, _ = llama
    ids = random_ids(20, 256, seed=2)
    _, hidden = hf_logits(hf, ids, hidden_states=True)  # hidden[j + 1] = output of layer j (j < L - 1)
    _, aux = full_logits(runner, ids)
    h = runner.model.config.hidden_size
    assert aux.shape == (len(ids), len(AUX_LAYERS) * h)
    for k, j in enumerate(AUX_LAYERS):
        assert rel_error(aux[:, k * h:(k + 1) * h], hidden[j + 1]) <= TOLERANCE


@pytest.mark.parametrize("page_size", [1, 16])
def test_paged_chunked_prefill_and_decode_match_full_forward(llama, page_size):
    _, runner, _ = llama
    seqs = [random_ids(41, 256, seed=3), random_ids(30, 256, seed=4)]
    paged = paged_logits(runner, seqs, [[7, 13, 5], [3, 12]], page_size=page_size)
    for seq, got in zip(seqs, paged, strict=True):
        assert rel_error(got, full_logits(runner, seq)[0]) <= PAGED_TOLERANCE


def test_bf16_weights_and_uint16_pools_are_as_close_as_transformers_in_bf16(llama):
    import copy

    import jax.numpy as jnp
    import torch

    hf, _, path = llama
    ids = random_ids(45, 256, seed=1)
    ref = hf_logits(hf, ids)
    hf_bf16_error = rel_error(hf_logits(copy.deepcopy(hf).to(torch.bfloat16), ids), ref)
    model = load_model(path, dtype="bfloat16", progress=False)
    ours, _ = full_logits(Runner(model), ids, kv_dtype=jnp.bfloat16)
    assert rel_error(ours, ref) <= 2 * hf_bf16_error
