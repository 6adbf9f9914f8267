"""Tiny gpt-oss configs and random models with every vector perturbed, shared by the training tests."""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from jaxserve.models.build import random_model
from jaxserve.models.config import ModelConfig
from jaxserve.training.target import target_config

WINDOW = 4


def tiny_config(vocab_size: int = 96, **overrides) -> dict:
    cfg = target_config(vocab_size, hidden_size=32, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=8,
                        intermediate_size=24, sliding_window=WINDOW)
    cfg.update(overrides)
    return cfg


def tiny_model(raw: dict, *, seed: int = 0, aux_layer_ids=(), scale: float = 3.0):
    """A random model with larger weights than the default init (attention far from uniform) and noisy
    biases, norm weights and sinks, so that any misplaced parameter shows in the logits."""
    model = random_model(ModelConfig.from_dict(raw), seed=seed, aux_hidden_state_layer_ids=aux_layer_ids)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    leaves, treedef = jax.tree.flatten(params)
    rng = np.random.default_rng(seed)
    new = []
    for leaf in leaves:
        if leaf.ndim == 1:
            new.append(leaf + rng.normal(0, 0.3, leaf.shape).astype(np.float32))
        else:
            new.append(leaf * scale)
    return nnx.merge(graphdef, jax.tree.unflatten(treedef, new), rest)
