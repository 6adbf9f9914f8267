"""Build models without eager initialisation: abstract (shapes only) for loading, or random under jit."""

from __future__ import annotations

from collections.abc import Sequence

import jax
from flax import nnx

from jaxserve.models.config import ModelConfig
from jaxserve.models.decoder import CausalLM
from jaxserve.models.registry import model_class


def abstract_model(config: ModelConfig, *, backend: str = "native",
                   aux_hidden_state_layer_ids: Sequence[int] = ()) -> CausalLM:
    """The model with `jax.ShapeDtypeStruct` parameters (no compute, no memory): fill it with the loader."""
    cls = model_class(config.architecture)
    return nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(0), backend=backend,
                                      aux_hidden_state_layer_ids=aux_hidden_state_layer_ids))


def random_model(config: ModelConfig, *, seed: int = 0, backend: str = "native",
                 aux_hidden_state_layer_ids: Sequence[int] = ()) -> CausalLM:
    """The model with random parameters, initialised in one jitted call (eager init compiles op by op)."""
    cls = model_class(config.architecture)

    def make() -> CausalLM:
        return cls(config, rngs=nnx.Rngs(seed), backend=backend,
                   aux_hidden_state_layer_ids=aux_hidden_state_layer_ids)

    graphdef, _ = nnx.split(nnx.eval_shape(make))
    state = jax.jit(lambda: nnx.state(make()))()
    return nnx.merge(graphdef, state)
