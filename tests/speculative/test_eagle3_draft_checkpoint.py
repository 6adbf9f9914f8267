"""EAGLE-3 checkpoints in the SpecForge layout: save -> load round trip and clear errors."""

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from jaxserve.loader.errors import MissingTensorError, ShapeMismatchError, UnexpectedTensorError
from jaxserve.speculative.eagle3_checkpoint import load_eagle3_draft, save_eagle3_draft
from tests.speculative.eagle3_helpers import AUX_IDS, HIDDEN, VOCAB, run_paged, tiny_draft, tiny_draft_config

EXPECTED_NAMES = {
    "fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
    "midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight",
    "midlayer.post_attention_layernorm.weight",
    *(f"midlayer.self_attn.{p}_proj.weight" for p in "qkvo"),
    *(f"midlayer.mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    model = tiny_draft(seed=3)
    return model, save_eagle3_draft(model, tmp_path_factory.mktemp("draft"))


def _copy_with(src, dst, drop=(), add=None, config_changes=None):
    dst.mkdir()
    tensors = load_file(str(src / "model.safetensors"))
    for name in drop:
        del tensors[name]
    tensors.update(add or {})
    save_file(tensors, str(dst / "model.safetensors"))
    config = json.loads((src / "config.json").read_text())
    config.update(config_changes or {})
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def test_saved_tensors_use_the_specforge_names_and_dtypes(saved):
    model, path = saved
    tensors = load_file(str(path / "model.safetensors"))
    assert set(tensors) == EXPECTED_NAMES
    assert tensors["d2t"].dtype == np.int64 and tensors["t2d"].dtype == np.bool_
    assert tensors["fc.weight"].shape == (HIDDEN, len(AUX_IDS) * HIDDEN)
    assert tensors["midlayer.self_attn.q_proj.weight"].shape == (4 * 8, 2 * HIDDEN)
    config = json.loads((path / "config.json").read_text())
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == list(AUX_IDS)
    assert config["draft_vocab_size"] == model.config.draft_vocab_size


def test_load_round_trip_gives_identical_outputs(saved):
    model, path = saved
    loaded = load_eagle3_draft(path)
    assert loaded.config == model.config
    rng = np.random.default_rng(0)
    embedding = rng.normal(size=(VOCAB, HIDDEN)).astype(np.float32)
    chunks = [(rng.integers(0, VOCAB, 7).astype(np.int32),
               rng.normal(size=(7, len(AUX_IDS) * HIDDEN)).astype(np.float32))]
    for (a_logits, a_hidden), (b_logits, b_hidden) in zip(run_paged(model, embedding, chunks),
                                                          run_paged(loaded, embedding, chunks), strict=True):
        np.testing.assert_array_equal(a_logits, b_logits)
        np.testing.assert_array_equal(a_hidden, b_hidden)
    np.testing.assert_array_equal(np.asarray(loaded.d2t[...]), np.asarray(model.d2t[...]))


def test_embed_tokens_in_the_checkpoint_is_ignored(saved, tmp_path):
    _, path = saved
    embed = np.zeros((VOCAB, HIDDEN), np.float32)
    extra = _copy_with(path, tmp_path / "e", add={"embed_tokens.weight": embed})
    load_eagle3_draft(extra)


def test_missing_tensor_is_named(saved, tmp_path):
    _, path = saved
    broken = _copy_with(path, tmp_path / "m", drop=["midlayer.hidden_norm.weight"])
    with pytest.raises(MissingTensorError, match=r"midlayer\.hidden_norm\.weight"):
        load_eagle3_draft(broken)


def test_missing_d2t_is_named(saved, tmp_path):
    _, path = saved
    broken = _copy_with(path, tmp_path / "d", drop=["d2t"])
    with pytest.raises(MissingTensorError, match="d2t"):
        load_eagle3_draft(broken)


def test_sglang_fused_layout_is_reported_as_unexpected(saved, tmp_path):
    _, path = saved
    fused = _copy_with(path, tmp_path / "f",
                       add={"model.midlayer.self_attn.qkv_proj.weight": np.zeros((4, 4), np.float32)})
    with pytest.raises(UnexpectedTensorError, match="qkv_proj"):
        load_eagle3_draft(fused)


def test_wrong_shape_names_tensor(saved, tmp_path):
    _, path = saved
    bad = _copy_with(path, tmp_path / "s", add={"fc.weight": np.zeros((HIDDEN, 2 * HIDDEN), np.float32)})
    with pytest.raises(ShapeMismatchError, match=r"fc\.weight"):
        load_eagle3_draft(bad)


def test_inconsistent_vocab_map_is_rejected(saved, tmp_path):
    _, path = saved
    d2t = load_file(str(path / "model.safetensors"))["d2t"].copy()
    d2t[-1] += 1000
    bad = _copy_with(path, tmp_path / "v", add={"d2t": d2t})
    with pytest.raises(ValueError, match="d2t"):
        load_eagle3_draft(bad)


def test_head_without_draft_vocab_loads_with_identity_map(tmp_path):
    model = tiny_draft(tiny_draft_config(draft_vocab_size=None))
    path = save_eagle3_draft(model, tmp_path / "full")
    loaded = load_eagle3_draft(path)
    assert loaded.config.draft_vocab_size is None
    np.testing.assert_array_equal(np.asarray(loaded.to_target_ids(np.arange(5))), np.arange(5))
    no_head = _copy_with(path, tmp_path / "nohead", drop=["lm_head.weight"])
    with pytest.raises(MissingTensorError, match="load_lm_head_from_target"):
        load_eagle3_draft(no_head)
