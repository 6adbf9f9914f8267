"""ModelConfig parsing: both HF rope/dtype spellings, sliding-layer derivation rules, field-naming errors."""

import pytest

from jaxserve.layers.rotary import RopeParams
from jaxserve.models.config import FULL, SLIDING, ConfigError, ModelConfig
from jaxserve.models.kv_layout import KVLayout
from jaxserve.models.registry import UnsupportedArchitectureError, model_class, supported_architectures

BASE = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=256, hidden_size=64,
            intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2)


def parse(**fields) -> ModelConfig:
    return ModelConfig.from_dict({**BASE, **fields})


def test_hub_and_transformers5_spellings_agree():
    llama3 = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                  original_max_position_embeddings=8192)
    hub = parse(rope_theta=500000.0, rope_scaling=dict(rope_type="llama3", **llama3), torch_dtype="bfloat16")
    v5 = parse(rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, **llama3), dtype="bfloat16")
    assert hub == v5
    assert hub.rope_for(3) == RopeParams(rope_type="llama3", theta=500000.0, **llama3)
    assert hub.dtype == "bfloat16" and hub.head_dim == 16


def test_old_rope_scaling_type_key_is_accepted():
    cfg = parse(rope_scaling=dict(type="linear", factor=2.0))
    assert cfg.rope_for(0) == RopeParams(rope_type="linear", factor=2.0)


def test_per_layer_type_rope_parameters():
    cfg = parse(layer_types=[SLIDING, FULL] * 2, sliding_window=16, rope_parameters={
        FULL: dict(rope_type="linear", factor=8.0, rope_theta=1e6),
        SLIDING: dict(rope_type="default", rope_theta=1e4)})
    assert cfg.rope_for(0).theta == 1e4 and cfg.rope_for(1).rope_type == "linear"


def test_gemma3_hub_style_local_base_frequency():
    cfg = parse(model_type="gemma3_text", sliding_window=32, sliding_window_pattern=2, rope_theta=1e6,
                rope_local_base_freq=1e4)
    assert cfg.layer_types == (SLIDING, FULL, SLIDING, FULL)
    assert cfg.rope_for(0).theta == 1e4 and cfg.rope_for(1).theta == 1e6


@pytest.mark.parametrize(("fields", "types"), [
    (dict(), (FULL,) * 4),
    (dict(sliding_window=8), (SLIDING,) * 4),  # Mistral: every layer
    (dict(use_sliding_window=False, sliding_window=8, max_window_layers=2), (FULL,) * 4),
    (dict(use_sliding_window=True, sliding_window=8, max_window_layers=3), (FULL, FULL, FULL, SLIDING)),
    (dict(model_type="gemma2", sliding_window=8), (SLIDING, FULL, SLIDING, FULL)),
    (dict(sliding_window=8, layer_types=[FULL, SLIDING, SLIDING, FULL]), (FULL, SLIDING, SLIDING, FULL)),
])
def test_sliding_layer_rules(fields, types):
    cfg = parse(**fields)
    assert cfg.layer_types == types
    assert [cfg.window_of(i) for i in range(4)] == [8 if t == SLIDING else None for t in types]


def test_kv_layout_is_hybrid_only_with_both_kinds_of_layers():
    assert not KVLayout.from_config(parse()).hybrid
    assert not KVLayout.from_config(parse(sliding_window=8)).hybrid
    hybrid = KVLayout.from_config(parse(model_type="gemma2", sliding_window=8))
    assert hybrid.hybrid and hybrid.swa_layer_ids == (0, 2)


@pytest.mark.parametrize(("fields", "message"), [
    (dict(hidden_size=None), "'hidden_size' is missing"),
    (dict(architectures=[]), "'architectures'"),
    (dict(dtype="int4"), "'dtype'"),
    (dict(layer_types=[FULL] * 3), "'layer_types' has 3 entries"),
    (dict(layer_types=[FULL, "chunked_attention", FULL, FULL]), "chunked_attention"),
    (dict(layer_types=[SLIDING] * 4), "'sliding_window' is missing"),
    (dict(rope_scaling=dict(rope_type="llama3", factor=8.0)), "rope_scaling.*low_freq_factor"),
    (dict(rope_scaling=dict(rope_type="longrope")), "longrope"),
])
def test_errors_name_the_field(fields, message):
    with pytest.raises(ConfigError, match=message):
        parse(**fields)


def test_registry_has_all_seven_architectures_and_rejects_others():
    assert supported_architectures() == sorted([
        "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM",
        "Gemma2ForCausalLM", "Gemma3ForCausalLM", "GptOssForCausalLM"])
    assert model_class("Qwen3ForCausalLM").qk_norm
    with pytest.raises(UnsupportedArchitectureError, match=r"Phi3ForCausalLM.*supported: Gemma2ForCausalLM"):
        model_class("Phi3ForCausalLM")
