"""The target trainer's forward is the serving model's math, and what it saves is a real HF checkpoint."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.loader.load import load_model
from jaxserve.training.dense import dense_forward
from jaxserve.training.export import save_hf_checkpoint
from tests.models.helpers import Runner, full_logits, hf_logits, rel_error
from tests.training.tiny import WINDOW, tiny_config, tiny_model

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

SEQ_LEN = 24  # > WINDOW: the sliding layers' window is active


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    raw = tiny_config()
    model = tiny_model(raw, aux_layer_ids=(0, 1, 2))
    path = save_hf_checkpoint(model, tmp_path_factory.mktemp("target"), raw)
    return raw, model, path


def test_dense_training_forward_equals_paged_serving_forward(saved):
    _, model, _ = saved
    ids = np.random.default_rng(1).integers(0, 96, size=(2, SEQ_LEN)).astype(np.int32)
    logits, aux = dense_forward(model, jnp.asarray(ids))
    runner = Runner(model)
    for row in range(2):
        ref_logits, ref_aux = full_logits(runner, ids[row])
        assert rel_error(np.asarray(logits[row]), ref_logits) <= 1e-5
        assert rel_error(np.asarray(aux[row]), ref_aux) <= 1e-5


def test_sliding_window_matters_in_the_dense_forward(saved):
    raw, model, _ = saved
    ids = jnp.asarray(np.random.default_rng(2).integers(0, 96, size=(1, SEQ_LEN)).astype(np.int32))
    base, _ = dense_forward(model, ids)
    no_window = tiny_model({**raw, "layer_types": ["full_attention"] * 4}, aux_layer_ids=(0, 1, 2))
    assert rel_error(np.asarray(dense_forward(no_window, ids)[0]), np.asarray(base)) > 1e-3
    assert WINDOW < SEQ_LEN


def test_sinks_matter_in_the_dense_forward(saved):
    from flax import nnx

    _, model, _ = saved
    ids = jnp.asarray(np.random.default_rng(2).integers(0, 96, size=(1, SEQ_LEN)).astype(np.int32))
    base, _ = dense_forward(model, ids)
    shifted = nnx.clone(model)
    for layer in shifted.layers:
        layer.attn.sinks[...] = layer.attn.sinks[...] + 2.0
    assert rel_error(np.asarray(dense_forward(shifted, ids)[0]), np.asarray(base)) > 1e-3


def test_saved_checkpoint_round_trips_through_the_jaxserve_loader(saved):
    _, model, path = saved
    loaded = load_model(path, progress=False)
    ids = np.arange(SEQ_LEN, dtype=np.int32) % 96
    np.testing.assert_array_equal(full_logits(Runner(loaded), ids)[0], full_logits(Runner(model), ids)[0])


@pytest.mark.hf
def test_transformers_loads_the_saved_checkpoint_with_the_same_logits(saved):
    from transformers import AutoModelForCausalLM

    _, model, path = saved
    hf = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    ids = np.random.default_rng(3).integers(0, 96, size=SEQ_LEN).astype(np.int32)
    ours = np.asarray(dense_forward(model, jnp.asarray(ids[None]))[0][0])
    assert rel_error(ours, hf_logits(hf, ids)) <= 1e-4


def test_batched_generation_equals_step_by_step_dense_greedy(saved):
    from jaxserve.training.generate import continue_prompts

    _, model, _ = saved
    rng = np.random.default_rng(4)
    prompts = rng.integers(0, 96, size=(3, 5)).astype(np.int32)
    out = continue_prompts(model, prompts, 20, np.zeros(3), rng)  # 25 tokens > the window of 4
    np.testing.assert_array_equal(out[:, :5], prompts)
    # one fixed shape (eager JAX compiles each op once per shape): the dense forward is causal, so the
    # zeros after position t - 1 do not change its logits
    seqs = np.zeros((3, 25), np.int32)
    seqs[:, :5] = prompts
    for t in range(5, 25):
        logits, _ = dense_forward(model, jnp.asarray(seqs))
        seqs[:, t] = np.asarray(logits[:, t - 1]).argmax(-1)
    np.testing.assert_array_equal(out, seqs)
