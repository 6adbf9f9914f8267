"""Load and save EAGLE-3 heads in the SpecForge/EAGLE Hugging Face layout.

Layout (SpecForge's checkpoints, e.g. an EAGLE-3 head for gpt-oss on the Hub): `config.json`
(`draft_vocab_size`, `eagle_config.eagle_aux_hidden_state_layer_ids`, Llama fields) and safetensors with
`fc.weight`, `midlayer.*`, `norm.weight`, `lm_head.weight`, `d2t` (int64), `t2d` (bool); an
`embed_tokens.weight`, if present, is ignored (the target's embedding is used). SGLang's own layout (`model.`
prefix, fused qkv) is not read: its tensors are reported as unexpected.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from jaxserve.layers.backends import DEFAULT_BACKEND
from jaxserve.loader.errors import MissingTensorError
from jaxserve.loader.load import load_params
from jaxserve.loader.safetensors_reader import SafetensorsFile, checkpoint_files
from jaxserve.models.config import ConfigError
from jaxserve.models.weight_spec import transpose
from jaxserve.speculative.eagle3_draft import Eagle3Config, Eagle3Draft
from jaxserve.speculative.vocab_map import check_vocab_map


def read_eagle3_config(directory: str | Path, *, target_num_layers: int | None = None) -> Eagle3Config:
    path = Path(directory) / "config.json"
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"no config.json at {path}") from None
    return Eagle3Config.from_dict(raw, target_num_layers=target_num_layers)


def load_eagle3_draft(directory: str | Path, *, target_num_layers: int | None = None,
                      dtype: str | None = None, backend: str = DEFAULT_BACKEND,
                      progress: bool = False) -> Eagle3Draft:
    """config.json + safetensors in `directory` -> an `Eagle3Draft` (parameters in `dtype`, default the
    checkpoint's). Raises ConfigError, MissingTensorError (naming the tensor), UnexpectedTensorError,
    ShapeMismatchError; ValueError when d2t/t2d disagree."""
    config = read_eagle3_config(directory, target_num_layers=target_num_layers)
    if dtype is not None:
        config = dataclasses.replace(config, dtype=dtype)
    names = {n for p in checkpoint_files(directory) for n in SafetensorsFile(p).names()}
    if config.draft_vocab_size is None and "lm_head.weight" not in names:
        raise MissingTensorError(f"{directory}: no draft_vocab_size and no lm_head.weight: this head expects "
                                 f"the target's LM head (load_lm_head_from_target), which jaxserve does not "
                                 f"support")
    model = nnx.eval_shape(lambda: Eagle3Draft(config, rngs=nnx.Rngs(0), backend=backend))
    model = load_params(model, directory, progress=progress)
    if config.draft_vocab_size is not None:
        check_vocab_map(np.asarray(model.d2t[...]), np.asarray(model.t2d[...]))
    return model


def eagle3_tensors(model: Eagle3Draft) -> dict[str, np.ndarray]:
    """`{name: array}` in the SpecForge layout (linear weights `[out, in]`, d2t int64, t2d bool)."""
    flat = nnx.to_flat_state(nnx.state(model))
    values = {path: np.asarray(var[...]) for path, var in zip(flat.paths, flat.leaves, strict=True)}
    tensors = {}
    for spec in model.weight_specs():
        value = values[spec.target]
        tensors[spec.sources[0]] = np.ascontiguousarray(value.T if spec.transform is transpose else value)
    if "d2t" in tensors:
        tensors["d2t"] = tensors["d2t"].astype(np.int64)
        tensors["t2d"] = tensors["t2d"].astype(np.bool_)
    return tensors


def save_eagle3_draft(model: Eagle3Draft, directory: str | Path) -> Path:
    """Write `config.json` (`model.config.to_dict()`) and `model.safetensors`; returns the directory."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(model.config.to_dict(), indent=1))
    save_file(eagle3_tensors(model), str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory
