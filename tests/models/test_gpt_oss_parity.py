"""gpt-oss (sinks, alternating window/full, YaRN, MoE, biases; plain and MXFP4 experts) vs transformers."""

import json

import numpy as np
import pytest

from jaxserve.loader.errors import MissingTensorError
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

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

WINDOW = 8
AUX_LAYERS = (0, 1)  # EAGLE-3 captures gpt-oss layers' outputs
CONFIG = dict(num_hidden_layers=3, head_dim=16, sliding_window=WINDOW, num_local_experts=4,
              num_experts_per_tok=2, intermediate_size=64, max_position_embeddings=4096 * 32,
              swiglu_limit=1.5)  # low limit: the gate/up clamps are active on these activations


def _checkpoint(path, **overrides):
    """Tiny random checkpoint (biases, norms and sinks perturbed by the helper); the torch reference runs
    transformers' eager per-expert loop."""
    hf = make_hf_checkpoint(path, "gpt_oss", **{**CONFIG, **overrides})
    hf.config._experts_implementation = "eager"
    return hf


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt_oss")
    hf = _checkpoint(path)
    return hf, Runner(load_model(path, progress=False, aux_hidden_state_layer_ids=AUX_LAYERS)), path


@pytest.mark.hf
def test_full_sequence_logits_match_transformers(gpt_oss):
    hf, runner, _ = gpt_oss
    cfg = runner.model.config
    assert cfg.layer_types == ("sliding_attention", "full_attention", "sliding_attention")
    assert runner.model.kv_layout.swa_layer_ids == (0, 2)
    assert dict(cfg.rope)["full_attention"].rope_type == "yarn"
    ids = random_ids(40, 256, seed=1)
    assert rel_error(full_logits(runner, ids)[0], hf_logits(hf, ids)) <= TOLERANCE


@pytest.mark.hf
def test_sorted_moe_dispatch_matches_transformers(gpt_oss):
    """The grouped (ragged_dot) dispatch that "auto" picks off-CPU, through the whole model."""
    from flax import nnx

    from jaxserve.loader.load import load_params
    from jaxserve.models.config import ModelConfig
    from jaxserve.models.gpt_oss import GptOssForCausalLM

    class SortedGptOss(GptOssForCausalLM):
        moe_dispatch = "sorted"

    hf, _, path = gpt_oss
    config = ModelConfig.from_file(path)
    model = load_params(nnx.eval_shape(lambda: SortedGptOss(config, rngs=nnx.Rngs(0))), path, progress=False)
    assert model.layers[0].mlp.dispatch == "sorted"
    ids = random_ids(40, 256, seed=1)
    assert rel_error(full_logits(Runner(model), ids)[0], hf_logits(hf, ids)) <= TOLERANCE


@pytest.mark.hf
def test_window_matters(gpt_oss):
    hf, _, path = gpt_oss
    no_window = load_variant(path, layer_types=("full_attention",) * 3, sliding_window=None)
    ids = random_ids(40, 256, seed=1)
    assert rel_error(full_logits(Runner(no_window), ids)[0], hf_logits(hf, ids)) > 100 * TOLERANCE


@pytest.mark.hf
@pytest.mark.parametrize("window", [WINDOW - 1, WINDOW + 1])
def test_window_is_inclusive_of_self_off_by_one_fails(gpt_oss, window):
    """HF: `sliding_window` W keys including the query itself (SGLang stores W - 1 as an exclusive count)."""
    hf, _, path = gpt_oss
    variant = load_variant(path, sliding_window=window)
    ids = random_ids(40, 256, seed=1)
    assert rel_error(full_logits(Runner(variant), ids)[0], hf_logits(hf, ids)) > 10 * TOLERANCE


@pytest.mark.hf
def test_sinks_matter(gpt_oss):
    hf, _, path = gpt_oss
    model = load_variant(path)
    for layer in model.layers:
        layer.attn.sinks[...] = np.zeros(layer.attn.sinks.shape, np.float32)
    ids = random_ids(40, 256, seed=1)
    assert rel_error(full_logits(Runner(model), ids)[0], hf_logits(hf, ids)) > 100 * TOLERANCE


@pytest.mark.hf
def test_aux_hidden_states_are_outputs_of_the_listed_layers(gpt_oss):
    hf, runner, _ = gpt_oss
    ids = random_ids(20, 256, seed=2)
    _, hidden = hf_logits(hf, ids, hidden_states=True)  # hidden[j + 1] = output of layer j (j < L - 1)
    _, aux = full_logits(runner, ids)
    h = runner.model.config.hidden_size
    assert aux.shape == (len(ids), len(AUX_LAYERS) * h)
    for k, j in enumerate(AUX_LAYERS):
        assert rel_error(aux[:, k * h:(k + 1) * h], hidden[j + 1]) <= TOLERANCE


@pytest.mark.hf
@pytest.mark.parametrize("page_size", [1, 16])
def test_paged_hybrid_pools_with_evicted_swa_pages_match_full_forward(gpt_oss, page_size):
    _, runner, _ = gpt_oss
    seqs = [random_ids(37, 256, seed=3), random_ids(26, 256, seed=4)]
    paged = paged_logits(runner, seqs, [[9, 2, 13], [5, 11]], page_size=page_size, window=WINDOW)
    for seq, got in zip(seqs, paged, strict=True):
        assert rel_error(got, full_logits(runner, seq)[0]) <= PAGED_TOLERANCE


def _random_mxfp4(rng, num_experts, rows, cols):
    blocks = rng.integers(0, 256, size=(num_experts, rows, cols // 32, 16), dtype=np.uint8)
    scales = rng.integers(121, 126, size=(num_experts, rows, cols // 32), dtype=np.uint8)  # 2^-6 .. 2^-2
    return blocks, scales


def _write_mxfp4_checkpoint(path, hf, seed):
    """Rewrite `path`'s experts as MXFP4 blocks/scales in HF naming and put the same (dequantized by
    transformers' own function) weights into `hf`."""
    import torch
    from safetensors.numpy import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    rng = np.random.default_rng(seed)
    tensors = load_file(path / "model.safetensors")
    cfg = hf.config
    shapes = {"gate_up_proj": (2 * cfg.intermediate_size, cfg.hidden_size),  # (rows = outputs, cols = inputs)
              "down_proj": (cfg.hidden_size, cfg.intermediate_size)}
    for i, layer in enumerate(hf.model.layers):
        for name, (rows, cols) in shapes.items():
            key = f"model.layers.{i}.mlp.experts.{name}"
            blocks, scales = _random_mxfp4(rng, cfg.num_local_experts, rows, cols)
            del tensors[key]
            tensors[f"{key}_blocks"], tensors[f"{key}_scales"] = blocks, scales
            dequantized = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales),
                                                     dtype=torch.float32)
            with torch.no_grad():
                getattr(layer.mlp.experts, name).copy_(dequantized)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (path / "config.json").write_text(json.dumps(config))
    return tensors


@pytest.mark.hf
def test_mxfp4_expert_checkpoint_matches_transformers_on_dequantized_weights(tmp_path):
    hf = _checkpoint(tmp_path, num_hidden_layers=2)
    _write_mxfp4_checkpoint(tmp_path, hf, seed=11)
    runner = Runner(load_model(tmp_path, progress=False))
    ids = random_ids(30, 256, seed=2)
    assert rel_error(full_logits(runner, ids)[0], hf_logits(hf, ids)) <= TOLERANCE


@pytest.mark.hf
def test_mxfp4_checkpoint_missing_scales_names_the_tensor(tmp_path):
    from safetensors.numpy import save_file

    hf = _checkpoint(tmp_path, num_hidden_layers=2)
    tensors = _write_mxfp4_checkpoint(tmp_path, hf, seed=12)
    del tensors["model.layers.1.mlp.experts.down_proj_scales"]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(MissingTensorError, match=r"model\.layers\.1\.mlp\.experts\.down_proj_scales"):
        load_model(tmp_path, progress=False)


@pytest.mark.hf
def test_mxfp4_experts_load_exactly_into_bfloat16(tmp_path):
    import ml_dtypes
    import torch
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    hf = _checkpoint(tmp_path, num_hidden_layers=2)
    tensors = _write_mxfp4_checkpoint(tmp_path, hf, seed=13)
    model = load_model(tmp_path, dtype="bfloat16", progress=False)
    key = "model.layers.1.mlp.experts.gate_up_proj"
    want = convert_moe_packed_tensors(torch.from_numpy(tensors[f"{key}_blocks"]),
                                      torch.from_numpy(tensors[f"{key}_scales"]), dtype=torch.float32)
    got = np.asarray(model.layers[1].mlp.gate_up_proj[...])
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got.astype(np.float32), want.numpy())


def test_hub_style_config_gives_yarn_mxfp4_specs_and_hybrid_layout():
    """The Hub config.json spelling (rope_scaling + rope_theta, quantization_config) at toy sizes."""
    from jaxserve.models.build import abstract_model
    from jaxserve.models.config import ModelConfig

    raw = dict(architectures=["GptOssForCausalLM"], model_type="gpt_oss", vocab_size=256, hidden_size=64,
               intermediate_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
               head_dim=16, sliding_window=128, num_local_experts=4, num_experts_per_tok=2,
               layer_types=["sliding_attention", "full_attention"] * 2, attention_bias=True,
               rope_theta=150000, max_position_embeddings=131072, swiglu_limit=7.0, torch_dtype="bfloat16",
               rope_scaling=dict(rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0,
                                 original_max_position_embeddings=4096, truncate=False),
               quantization_config=dict(quant_method="mxfp4"))
    model = abstract_model(ModelConfig.from_dict(raw))
    rope = model.config.rope_for(1)
    assert (rope.rope_type, rope.theta, rope.factor, rope.truncate) == ("yarn", 150000.0, 32.0, False)
    assert model.config.window_of(0) == 128 and model.config.window_of(1) is None
    assert model.kv_layout.swa_layer_ids == (0, 2)
    sources = {s for spec in model.weight_specs() for s in spec.sources}
    expert = "model.layers.3.mlp.experts."
    assert {f"{expert}gate_up_proj_blocks", f"{expert}down_proj_scales", f"{expert}down_proj_bias",
            "model.layers.3.self_attn.sinks", "lm_head.weight"} <= sources
    assert f"{expert}gate_up_proj" not in sources
    with pytest.raises(ValueError, match="quant_method"):
        abstract_model(ModelConfig.from_dict({**raw, "quantization_config": {"quant_method": "fp8"}}))
    with pytest.raises(ValueError, match="num_local_experts"):
        abstract_model(ModelConfig.from_dict({**raw, "num_local_experts": None}))
