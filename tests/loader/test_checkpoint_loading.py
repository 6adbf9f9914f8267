"""Loading HF checkpoints: sharded and single files, dtype conversion, tied embeddings, placement, and clear
errors for missing/unexpected tensors, shape mismatches, unsupported architectures and corrupt files."""

import json
import shutil

import jax
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from jaxserve.loader.errors import (
    CorruptCheckpointError,
    MissingTensorError,
    ShapeMismatchError,
    UnexpectedTensorError,
)
from jaxserve.loader.load import load_model
from jaxserve.models.registry import UnsupportedArchitectureError
from tests.models.helpers import (
    TOLERANCE,
    Runner,
    full_logits,
    hf_logits,
    make_hf_checkpoint,
    random_ids,
    rel_error,
)

pytestmark = [pytest.mark.hf, pytest.mark.slow]


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama_ckpt")
    hf = make_hf_checkpoint(path, "llama")
    return path, hf


@pytest.fixture
def ckpt(llama_dir, tmp_path):
    """A private copy of the checkpoint that a test may damage."""
    target = tmp_path / "ckpt"
    shutil.copytree(llama_dir[0], target)
    return target


def _params(model):
    return {"/".join(map(str, p)): np.asarray(v[...]) for p, v in nnx.to_flat_state(nnx.state(model))}


def _rewrite(ckpt, edit):
    tensors = load_file(ckpt / "model.safetensors")
    edit(tensors)
    save_file(tensors, ckpt / "model.safetensors", metadata={"format": "pt"})


def test_sharded_checkpoint_loads_the_same_parameters(llama_dir, tmp_path):
    path, hf = llama_dir
    hf.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    assert len(list(tmp_path.glob("*.safetensors"))) > 2
    single, sharded = _params(load_model(path, progress=False)), _params(load_model(tmp_path, progress=False))
    assert single.keys() == sharded.keys()
    for name in single:
        np.testing.assert_array_equal(single[name], sharded[name], err_msg=name)


def test_bf16_checkpoint_loads_in_checkpoint_dtype_or_converted(llama_dir, tmp_path):
    import copy

    import torch

    hf = copy.deepcopy(llama_dir[1]).to(torch.bfloat16)
    hf.save_pretrained(tmp_path)
    want = hf.model.embed_tokens.weight.detach().float().numpy()
    native = load_model(tmp_path, progress=False)
    assert native.config.dtype == "bfloat16"
    assert native.embed.embed.embedding[...].dtype == jax.numpy.bfloat16
    converted = load_model(tmp_path, dtype="float32", progress=False)
    np.testing.assert_array_equal(np.asarray(converted.embed.embed.embedding[...]), want)
    np.testing.assert_array_equal(np.asarray(native.layers[0].attn.q_proj.kernel[...], np.float32),
                                  hf.model.layers[0].self_attn.q_proj.weight.detach().float().numpy().T)


def test_tied_embeddings_have_no_lm_head_and_match_transformers(tmp_path):
    hf = make_hf_checkpoint(tmp_path, "qwen2", tie_word_embeddings=True)
    assert "lm_head.weight" not in load_file(tmp_path / "model.safetensors")
    model = load_model(tmp_path, progress=False)
    assert not hasattr(model, "lm_head")
    ids = random_ids(20, 256, seed=5)
    assert rel_error(full_logits(Runner(model), ids)[0], hf_logits(hf, ids)) <= TOLERANCE


def test_every_parameter_is_placed_with_the_given_sharding(llama_dir):
    device = jax.devices()[0]
    asked = []

    def sharding_for(path, shape):
        asked.append(path)
        return jax.sharding.SingleDeviceSharding(device)

    model = load_model(llama_dir[0], sharding_for=sharding_for, progress=False)
    flat = nnx.to_flat_state(nnx.state(model))
    assert sorted(map(str, asked)) == sorted(map(str, flat.paths))
    assert all(v[...].sharding == jax.sharding.SingleDeviceSharding(device) for v in flat.leaves)


def test_missing_tensor_is_named(ckpt):
    _rewrite(ckpt, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(MissingTensorError, match=r"model\.layers\.1\.mlp\.up_proj\.weight.*layers/1/mlp"):
        load_model(ckpt, progress=False)


def test_shape_mismatch_names_tensor_and_both_shapes(ckpt):
    def edit(t):
        t["model.layers.0.self_attn.k_proj.weight"] = np.zeros((16, 64), np.float32)

    _rewrite(ckpt, edit)
    with pytest.raises(ShapeMismatchError, match=r"k_proj\.weight \[16, 64\].*\[64, 16\].*\[64, 32\]"):
        load_model(ckpt, progress=False)


def test_unexpected_tensor_is_reported(ckpt):
    def edit(t):
        t["model.layers.0.self_attn.q_proj.bias"] = np.zeros(64, np.float32)

    _rewrite(ckpt, edit)
    with pytest.raises(UnexpectedTensorError, match=r"q_proj\.bias"):
        load_model(ckpt, progress=False)


def test_unsupported_architecture_lists_supported_ones(ckpt):
    config = json.loads((ckpt / "config.json").read_text())
    config["architectures"] = ["FalconForCausalLM"]
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedArchitectureError, match=r"Falcon.*supported: .*GptOss.*LlamaForCausalLM"):
        load_model(ckpt, progress=False)


@pytest.mark.parametrize("damage", ["truncate", "garbage_header", "empty"])
def test_corrupt_safetensors_file_is_named(ckpt, damage):
    path = ckpt / "model.safetensors"
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "garbage_header":
        path.write_bytes(data[:8] + b"{not json" + data[17:])
    else:
        path.write_bytes(b"")
    with pytest.raises(CorruptCheckpointError, match=r"model\.safetensors"):
        load_model(ckpt, progress=False)


def test_index_naming_a_missing_shard_is_reported(llama_dir, tmp_path):
    llama_dir[1].save_pretrained(tmp_path, max_shard_size="40KB")
    next(iter(sorted(tmp_path.glob("model-*.safetensors")))).unlink()
    with pytest.raises(CorruptCheckpointError, match="does not exist"):
        load_model(tmp_path, progress=False)
