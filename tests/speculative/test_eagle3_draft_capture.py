"""Which target hidden states the draft's fc reads: `eagle_aux_hidden_state_layer_ids` = output of layer j,
checked against transformers' `hidden_states[j + 1]` (index 0 is the embedding output)."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.loader.load import load_model
from jaxserve.training.export import save_hf_checkpoint
from tests.models.helpers import Runner, full_logits
from tests.speculative.eagle3_helpers import tiny_draft_config
from tests.training.tiny import tiny_config, tiny_model

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it


@pytest.mark.hf
def test_captured_states_are_outputs_of_the_listed_target_layers(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    draft_cfg = tiny_draft_config(eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 2, 1]})
    raw = tiny_config(vocab_size=96)
    path = save_hf_checkpoint(tiny_model(raw), tmp_path / "t", raw)
    target = load_model(path, progress=False, aux_hidden_state_layer_ids=draft_cfg.aux_layer_ids)
    ids = np.random.default_rng(0).integers(0, 96, 20).astype(np.int32)
    _, aux = full_logits(Runner(target), ids)
    hf = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    with torch.no_grad():
        states = hf(torch.tensor(ids[None]), output_hidden_states=True).hidden_states
    want = np.concatenate([states[j + 1][0].numpy() for j in draft_cfg.aux_layer_ids], axis=-1)
    assert aux.shape == (20, 3 * raw["hidden_size"])
    assert float(np.abs(aux - want).max() / np.abs(want).max()) <= 1e-5
    assert jnp.asarray(aux).dtype == jnp.float32
