"""How checkpoint tensors become model parameters: one `WeightSpec` per parameter, declared by each model."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

ParamPath = tuple[str | int, ...]


def identity(x: np.ndarray) -> np.ndarray:
    return x


def transpose(x: np.ndarray) -> np.ndarray:
    """nn.Linear `[out, in]` -> NNX kernel `[in, out]`."""
    return x.T


@dataclasses.dataclass(frozen=True)
class WeightSpec:
    """Parameter `target` (an NNX state path, e.g. `("layers", 0, "attn", "q_proj", "kernel")`) is
    `transform(*tensors)` of the checkpoint tensors named in `sources`, in that order.

    The loader reads each source once, calls `transform` as soon as all of a spec's sources have been read
    and frees them after; `transform` gets numpy arrays (bf16 as ml_dtypes.bfloat16) and returns one array
    of the parameter's shape (any float dtype: the loader casts to the parameter dtype). Several specs may
    share a source (e.g. one fused tensor split into two parameters).
    """

    target: ParamPath
    sources: tuple[str, ...]
    transform: Callable[..., np.ndarray] = identity

    @classmethod
    def linear(cls, target: ParamPath, source: str) -> WeightSpec:
        return cls(target, (source,), transpose)

    @classmethod
    def copy(cls, target: ParamPath, source: str) -> WeightSpec:
        return cls(target, (source,), identity)
