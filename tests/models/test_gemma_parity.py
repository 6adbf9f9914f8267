"""Gemma 2 and Gemma 3 (text) vs transformers: sandwich (1 + w) norms, scaled embeddings, soft-caps,
query_pre_attn_scalar, alternating local/global layers in hybrid pools, Gemma 3 q/k norm and per-layer-type
rotary (local base, linear scaling on global layers only)."""

import dataclasses

import pytest

from jaxserve.layers.rotary import RopeParams
from jaxserve.loader.load import load_model
from jaxserve.models.config import FULL, SLIDING, ModelConfig
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

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

WINDOW = 8
# query_pre_attn_scalar != head_dim, so the default head_dim ** -0.5 scale would fail parity; soft-caps
# far below Gemma 2's released 50/30 so that they bend these tiny models' scores and logits visibly.
GEMMA2 = dict(num_hidden_layers=3, head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=24,
              attn_logit_softcapping=3.0, final_logit_softcapping=5.0)
GEMMA3_ROPE = {FULL: {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
               SLIDING: {"rope_type": "default", "rope_theta": 10_000.0}}
# pattern 3: layers [local, local, global]; attn_logit_softcapping is set to show it is ignored, as in HF
GEMMA3 = dict(num_hidden_layers=3, head_dim=16, sliding_window=WINDOW, sliding_window_pattern=3,
              query_pre_attn_scalar=24, rope_parameters=GEMMA3_ROPE, attn_logit_softcapping=1.0)


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma2")
    hf = make_hf_checkpoint(path, "gemma2", **GEMMA2)  # norm weights perturbed by the helper
    return hf, Runner(load_model(path, progress=False)), path


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma3")
    hf = make_hf_checkpoint(path, "gemma3_text", **GEMMA3)
    return hf, Runner(load_model(path, progress=False)), path


@pytest.fixture(params=["gemma2", "gemma3"])
def gemma(request):
    return request.getfixturevalue(request.param)


@pytest.mark.hf
def test_gemma2_logits_match_transformers(gemma2):
    hf, runner, _ = gemma2
    cfg = runner.model.config
    assert cfg.tie_word_embeddings and cfg.hidden_act == "gelu_pytorch_tanh"
    assert cfg.layer_types == (SLIDING, FULL, SLIDING)
    assert runner.model.kv_layout.swa_layer_ids == (0, 2)
    ids = random_ids(40, 256, seed=1)
    assert rel_error(full_logits(runner, ids)[0], hf_logits(hf, ids)) <= TOLERANCE


@pytest.mark.hf
def test_gemma3_logits_match_transformers(gemma3):
    hf, runner, _ = gemma3
    cfg = runner.model.config
    assert cfg.layer_types == (SLIDING, SLIDING, FULL)
    assert runner.model.kv_layout.swa_layer_ids == (0, 1)
    assert cfg.rope_for(2).rope_type == "linear" and cfg.rope_for(0).theta == 10_000.0
    ids = random_ids(40, 256, seed=1)
    assert rel_error(full_logits(runner, ids)[0], hf_logits(hf, ids)) <= TOLERANCE


@pytest.mark.hf
def test_config_without_tie_word_embeddings_loads_tied(gemma2, tmp_path):
    """Hub Gemma configs written by transformers 4 omit `tie_word_embeddings` (equal to the default, True)."""
    import json
    import shutil

    hf, _, path = gemma2
    for name in ("config.json", "model.safetensors"):
        shutil.copy(path / name, tmp_path / name)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["tie_word_embeddings"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = load_model(tmp_path, progress=False)
    assert model.config.tie_word_embeddings
    ids = random_ids(40, 256, seed=1)
    assert rel_error(full_logits(Runner(model), ids)[0], hf_logits(hf, ids)) <= TOLERANCE


@pytest.mark.hf
def test_window_matters(gemma):
    hf, _, path = gemma
    no_window = load_variant(path, layer_types=(FULL,) * 3, sliding_window=None)
    ids = random_ids(40, 256, seed=1)
    assert rel_error(full_logits(Runner(no_window), ids)[0], hf_logits(hf, ids)) > 100 * TOLERANCE


@pytest.mark.hf
@pytest.mark.parametrize("cap", ["attn_logit_softcapping", "final_logit_softcapping"])
def test_gemma2_soft_caps_matter(gemma2, cap):
    hf, _, path = gemma2
    uncapped = load_variant(path, **{cap: None})
    ids = random_ids(40, 256, seed=1)
    assert rel_error(full_logits(Runner(uncapped), ids)[0], hf_logits(hf, ids)) > 100 * TOLERANCE


@pytest.mark.hf
@pytest.mark.parametrize("rope", [
    {FULL: RopeParams(rope_type="linear", factor=8.0, theta=1e6)},  # local layers on the global base
    {FULL: RopeParams(theta=1e6), SLIDING: RopeParams(theta=1e4)},  # no linear scaling on global layers
], ids=["local_base", "global_linear_scaling"])
def test_gemma3_per_layer_type_rope_matters(gemma3, rope):
    hf, _, path = gemma3
    variant = load_variant(path, rope=tuple(rope.items()))
    ids = random_ids(40, 256, seed=1)
    assert rel_error(full_logits(Runner(variant), ids)[0], hf_logits(hf, ids)) > 100 * TOLERANCE


@pytest.mark.hf
@pytest.mark.parametrize("page_size", [1, 16])
def test_paged_hybrid_pools_with_evicted_swa_pages_match_full_forward(gemma, page_size):
    _, runner, _ = gemma
    seqs = [random_ids(35, 256, seed=3), random_ids(27, 256, seed=4)]
    paged = paged_logits(runner, seqs, [[7, 12, 3], [10, 4]], page_size=page_size, window=WINDOW)
    for seq, got in zip(seqs, paged, strict=True):
        assert rel_error(got, full_logits(runner, seq)[0]) <= PAGED_TOLERANCE


def test_gemma3_hub_style_config_parses_like_transformers5_spelling():
    """Hub config.json spelling (rope_theta + rope_local_base_freq + rope_scaling, sliding_window_pattern
    without layer_types) gives the layer pattern and per-layer rotary of the transformers 5 spelling."""
    common = dict(architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", vocab_size=256,
                  hidden_size=64, intermediate_size=128, num_hidden_layers=12, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, sliding_window=WINDOW)
    hub = ModelConfig.from_dict({**common, "sliding_window_pattern": 6, "rope_theta": 1e6,
                                 "rope_local_base_freq": 1e4,
                                 "rope_scaling": {"rope_type": "linear", "factor": 8.0}})
    layer_types = [FULL if (i + 1) % 6 == 0 else SLIDING for i in range(12)]
    v5 = ModelConfig.from_dict({**common, "layer_types": layer_types, "rope_parameters": GEMMA3_ROPE})
    assert hub.layer_types == v5.layer_types == tuple(layer_types)
    for i in range(12):
        assert dataclasses.asdict(hub.rope_for(i)) == dataclasses.asdict(v5.rope_for(i)), i
    assert [hub.rope_for(i).rope_type for i in (4, 5)] == ["default", "linear"]


def test_gemma2_hub_style_config_alternates_from_a_sliding_layer_0():
    """Gemma 2 Hub configs carry no layer_types: even layers slide (layer 0 first), odd layers are global."""
    raw = dict(architectures=["Gemma2ForCausalLM"], model_type="gemma2", vocab_size=256, hidden_size=64,
               intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
               head_dim=16, sliding_window=WINDOW, hidden_act="gelu_pytorch_tanh",
               hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=24, attn_logit_softcapping=50.0,
               final_logit_softcapping=30.0, cache_implementation="hybrid", tie_word_embeddings=True)
    cfg = ModelConfig.from_dict(raw)
    assert cfg.layer_types == (SLIDING, FULL, SLIDING, FULL)
    assert (cfg.attn_logit_softcapping, cfg.final_logit_softcapping) == (50.0, 30.0)
