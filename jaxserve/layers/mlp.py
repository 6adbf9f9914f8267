"""Gated feed-forward block (SwiGLU / GeGLU): `down(act(gate(x)) * up(x))`."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx


def _gelu_tanh(x: jax.Array) -> jax.Array:
    return jax.nn.gelu(x, approximate=True)


def _gelu_exact(x: jax.Array) -> jax.Array:
    return jax.nn.gelu(x, approximate=False)


ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "gelu_pytorch_tanh": _gelu_tanh,
    "gelu_new": _gelu_tanh,
    "gelu": _gelu_exact,
}


def get_activation(name: str) -> Callable[[jax.Array], jax.Array]:
    """Look up an HF `hidden_act` / `hidden_activation` name; raises ValueError naming the supported ones."""
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"hidden_act {name!r} is not supported; supported: {sorted(ACTIVATIONS)}") from None


class GatedMLP(nnx.Module):
    """`x [T, hidden] -> [T, hidden]`; parameters `gate_proj`, `up_proj` ([hidden, inter]) and `down_proj`."""

    def __init__(self, hidden_size: int, intermediate_size: int, *, activation: str = "silu",
                 use_bias: bool = False, dtype: jnp.dtype = jnp.float32, rngs: nnx.Rngs):
        def dense(n_in: int, n_out: int) -> nnx.Linear:
            return nnx.Linear(n_in, n_out, use_bias=use_bias, dtype=dtype, param_dtype=dtype, rngs=rngs)

        self.gate_proj = dense(hidden_size, intermediate_size)
        self.up_proj = dense(hidden_size, intermediate_size)
        self.down_proj = dense(intermediate_size, hidden_size)
        self.activation = activation
        get_activation(activation)  # fail at construction, not at trace time

    def __call__(self, x: jax.Array) -> jax.Array:
        act = get_activation(self.activation)
        return self.down_proj(act(self.gate_proj(x)) * self.up_proj(x))
