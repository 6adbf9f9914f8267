"""Orbax checkpoints of a model's parameters: the format `python -m jaxserve.convert` writes and
`jaxserve.loader.load.load_model` detects.

Layout of a converted directory: `config.json` (the Hugging Face config, its `dtype` set to the stored
parameters' dtype), the tokenizer and generation files copied from the source, and `params/`, an orbax
`StandardCheckpointer` checkpoint of the model's parameter state in nnx's pure-dict form (module path ->
array, in the layout the model multiplies with: transposed, fused and dequantized once, at conversion).

Restoring hands orbax the abstract target (shape, dtype and sharding of every parameter), so each array is
read straight into its final placement and dtype: no host copy of the model, and a sharded mesh placement
(`sharding_for`, as for safetensors) works unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import jax
from flax import nnx

from jaxserve.loader.errors import CorruptCheckpointError
from jaxserve.models.decoder import CausalLM

PARAMS_DIR = "params"
ShardingFn = Callable[[tuple, tuple[int, ...]], jax.sharding.Sharding | None]


def is_orbax_checkpoint(directory: str | Path) -> bool:
    """True when `directory` holds a converted checkpoint (a `params/` folder next to config.json)."""
    directory = Path(directory)
    return (directory / PARAMS_DIR).is_dir() and (directory / "config.json").is_file()


def save_params(model: CausalLM, directory: str | Path) -> None:
    """Write `model`'s parameters to `directory/params` (which must not exist); blocks until written."""
    import orbax.checkpoint as ocp

    _, state = nnx.split(model)
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(Path(directory).resolve() / PARAMS_DIR, nnx.to_pure_dict(state))
        checkpointer.wait_until_finished()


def restore_params(model: CausalLM, directory: str | Path, *,
                   sharding_for: ShardingFn | None = None) -> CausalLM:
    """Fill an abstract (or any) model's parameters from `directory/params`; returns a new model. Arrays
    come back in the model's parameter dtypes (cast by orbax when the stored dtype differs) and placed by
    `sharding_for(path, shape)` (None: the default device). Raises CorruptCheckpointError when the stored
    tree does not match the model (a missing or extra parameter, a different shape) or cannot be read."""
    import orbax.checkpoint as ocp

    graphdef, state = nnx.split(model)
    default = jax.sharding.SingleDeviceSharding(jax.devices()[0])

    def target(path, var):
        shape = tuple(var.shape)
        sharding = (sharding_for(tuple(path), shape) if sharding_for is not None else None) or default
        return jax.ShapeDtypeStruct(shape, var.dtype, sharding=sharding)

    flat = nnx.to_flat_state(state)
    leaves = [var.replace(target(path, var)) for path, var in zip(flat.paths, flat.leaves, strict=True)]
    abstract = nnx.from_flat_state(nnx.FlatState.from_sorted_keys_values(flat.paths, leaves))
    location = Path(directory).resolve() / PARAMS_DIR
    try:
        with ocp.StandardCheckpointer() as checkpointer:
            restored = checkpointer.restore(location, nnx.to_pure_dict(abstract))
    except (ValueError, KeyError, FileNotFoundError) as e:
        raise CorruptCheckpointError(f"orbax checkpoint at {location} does not match "
                                     f"{type(model).__name__}'s parameters: {e}") from None
    nnx.replace_by_pure_dict(state, restored)
    return nnx.merge(graphdef, state)
