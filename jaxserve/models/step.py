"""Jitted forward step: `nnx.split` once, `jax.jit` a pure function of (params, inputs, donated pools).

`nnx.jit` costs milliseconds of Python per call; split + merge inside `jax.jit` costs a fraction of one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
from flax import nnx

from jaxserve.models.decoder import CausalLM

ForwardFn = Callable[..., tuple[jax.Array, dict[str, jax.Array], jax.Array | None]]


def make_forward(model: CausalLM) -> tuple[ForwardFn, Any]:
    """Return `(forward, params)`; `forward(params, input_ids, meta, kv_pools, return_all_logits=False)`
    follows `CausalLM.__call__` and donates `kv_pools` (the caller must use the returned pools).

    One compilation per distinct (token, sequence, page) bucket triple and `return_all_logits` value;
    `forward._cache_size()` counts them.
    """
    graphdef, params = nnx.split(model)

    @functools.partial(jax.jit, donate_argnames=("kv_pools",), static_argnames=("return_all_logits",))
    def forward(params, input_ids, meta, kv_pools, return_all_logits=False):
        return nnx.merge(graphdef, params)(input_ids, meta, kv_pools, return_all_logits=return_all_logits)

    return forward, params
