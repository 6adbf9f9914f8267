"""Load a Hugging Face checkpoint directory into a jaxserve model, streamed tensor by tensor.

Memory: each checkpoint tensor is a view of a memory-mapped file; it is transformed, copied into the
parameter dtype and placed on device (with an optional per-parameter `jax.sharding.Sharding`); then the copy
and the tensor's file pages are dropped. Beyond the parameters, host RAM holds about one tensor (or the
sources of one multi-source `WeightSpec`), never a second copy of the checkpoint (tests/loader/
test_loading_memory.py measures the peak).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import jax
import numpy as np
from flax import nnx
from tqdm import tqdm

from jaxserve.layers.backends import DEFAULT_BACKEND
from jaxserve.loader.errors import MissingTensorError, ShapeMismatchError, UnexpectedTensorError
from jaxserve.loader.orbax_params import is_orbax_checkpoint, restore_params
from jaxserve.loader.safetensors_reader import SafetensorsFile, checkpoint_files
from jaxserve.models.build import abstract_model
from jaxserve.models.config import ModelConfig
from jaxserve.models.decoder import CausalLM
from jaxserve.models.weight_spec import ParamPath, WeightSpec

ShardingFn = Callable[[ParamPath, tuple[int, ...]], jax.sharding.Sharding | None]


def _path_str(path: ParamPath) -> str:
    return "/".join(str(p) for p in path)


def load_params(model: CausalLM, directory: str | Path, *, sharding_for: ShardingFn | None = None,
                progress: bool = True) -> CausalLM:
    """Fill an abstract (or any) model's parameters from `directory`'s safetensors; returns a new model.

    Raises MissingTensorError / UnexpectedTensorError / ShapeMismatchError / CorruptCheckpointError
    naming the tensor (and file); checks every source exists before reading any data.
    """
    graphdef, state = nnx.split(model)
    flat = nnx.to_flat_state(state)
    params = dict(zip(flat.paths, flat.leaves, strict=True))
    specs = model.weight_specs()
    _check_specs_cover(specs, params)

    files = [SafetensorsFile(p) for p in checkpoint_files(directory)]
    where = {name: f for f in files for name in f.names()}
    by_source: dict[str, list[WeightSpec]] = defaultdict(list)
    for spec in specs:
        for source in spec.sources:
            if source not in where:
                raise MissingTensorError(f"tensor {source!r} (for parameter {_path_str(spec.target)}) is not "
                                         f"in the checkpoint at {directory}")
            by_source[source].append(spec)
    ignored = tuple(model.ignored_tensors) + (("lm_head.weight",) if model.config.tie_word_embeddings else ())
    unexpected = [n for n in where if n not in by_source and not n.endswith(ignored)]
    if unexpected:
        raise UnexpectedTensorError(f"checkpoint tensors not used by {type(model).__name__}: "
                                    f"{unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}")

    pending: dict[int, dict[str, np.ndarray]] = defaultdict(dict)
    loaded: dict[ParamPath, jax.Array] = {}
    for source in tqdm(list(by_source), desc="loading weights", unit="tensor", disable=not progress):
        tensor = where[source].get(source)
        for spec in by_source[source]:
            got = pending[id(spec)]
            got[source] = tensor
            if len(got) == len(spec.sources):
                del pending[id(spec)]
                loaded[spec.target] = _place(spec, [got[s] for s in spec.sources], params[spec.target],
                                             where[source].path, sharding_for)
        del tensor
        where[source].release(source)
    new_leaves = [var.replace(loaded[path]) for path, var in params.items()]
    return nnx.merge(graphdef, nnx.from_flat_state(nnx.FlatState.from_sorted_keys_values(flat.paths,
                                                                                          new_leaves)))


def _check_specs_cover(specs: Sequence[WeightSpec], params: dict) -> None:
    targets = [s.target for s in specs]
    unknown = [t for t in targets if t not in params]
    if unknown:
        raise ValueError(f"weight specs name parameters the model does not have: "
                         f"{[_path_str(t) for t in unknown[:8]]}")
    uncovered = [p for p in params if p not in set(targets)]
    if uncovered or len(set(targets)) != len(targets):
        raise ValueError(f"weight specs must cover each parameter exactly once; uncovered: "
                         f"{[_path_str(p) for p in uncovered[:8]]}")


def _place(spec: WeightSpec, tensors: list[np.ndarray], param: nnx.Variable, file: Path,
           sharding_for: ShardingFn | None) -> jax.Array:
    value = np.asarray(spec.transform(*tensors))
    if value.shape != tuple(param.shape):
        found = [f"{s} {list(t.shape)}" for s, t in zip(spec.sources, tensors, strict=True)]
        raise ShapeMismatchError(
            f"tensor {', '.join(found)} in {file.name} gives shape {list(value.shape)} for parameter "
            f"{_path_str(spec.target)}, which expects {list(param.shape)}")
    # always an owned copy: on CPU, device_put may alias an aligned numpy buffer, and a parameter must not
    # live in the checkpoint's file mapping (a file rewritten in place would change or fault it)
    value = value.astype(param.dtype, copy=True)
    sharding = sharding_for(spec.target, value.shape) if sharding_for is not None else None
    return jax.device_put(value, sharding) if sharding is not None else jax.device_put(value)


def load_model(directory: str | Path, *, dtype: str | None = None, backend: str = DEFAULT_BACKEND,
               aux_hidden_state_layer_ids: Sequence[int] = (), sharding_for: ShardingFn | None = None,
               progress: bool = True) -> CausalLM:
    """config.json + safetensors, or a converted orbax checkpoint (`jaxserve.loader.orbax_params`, detected),
    in `directory` -> a ready model (parameters in `dtype`, default the checkpoint's). The model class comes
    from `config.architectures[0]` via `jaxserve.models.registry`."""
    config = ModelConfig.from_file(directory)
    if dtype is not None:
        config = config.with_dtype(dtype)
    model = abstract_model(config, backend=backend, aux_hidden_state_layer_ids=aux_hidden_state_layer_ids)
    if is_orbax_checkpoint(directory):
        return restore_params(model, directory, sharding_for=sharding_for)
    return load_params(model, directory, sharding_for=sharding_for, progress=progress)
