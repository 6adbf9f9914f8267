"""Paged-attention backends, selected by name.

A backend is a callable with the signature of `native.paged_attention`: it writes the step's K/V into one
layer of a pool group, then attends every query token over its sequence's cached keys, and returns
`(out [T, q_heads, head_dim], new_pool)`. Accelerator kernels register themselves with
`@register_backend("name")`; models pick one by name. `native` is the plain-JAX reference (gathers every
key index of the page table per token), the test oracle and, for now, `DEFAULT_BACKEND`; `xla` is ragged
paged attention in plain JAX (work follows the real context), chosen with `attention_backend="xla"`;
`pallas_tpu` and `pallas_gpu` are the Pallas kernels for TPU and GPU (interpret mode elsewhere).

Why `xla` is not the default yet: a long pytest process (the speculative suite, one process) that runs the
engine on `xla` dies with a segmentation fault inside JAX's persistent compilation cache while it
serializes a later, unrelated executable; the same process on `native` passes. Until that is understood,
the dependable backend is the default.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

AttentionBackend = Callable[..., Any]

_BACKENDS: dict[str, AttentionBackend] = {}
DEFAULT_BACKEND = "native"


def register_backend(name: str) -> Callable[[AttentionBackend], AttentionBackend]:
    """Decorator registering a backend under `name`; re-registering a name raises ValueError."""

    def wrap(fn: AttentionBackend) -> AttentionBackend:
        if name in _BACKENDS and _BACKENDS[name] is not fn:
            raise ValueError(f"attention backend {name!r} is already registered")
        _BACKENDS[name] = fn
        return fn

    return wrap


def get_backend(name: str) -> AttentionBackend:
    """Return the backend registered as `name`; ValueError lists the registered names otherwise."""
    try:
        return _BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown attention backend {name!r}; registered: {sorted(_BACKENDS)}") from None


def available_backends() -> list[str]:
    return sorted(_BACKENDS)


# register "native", "xla" and the Pallas kernels "pallas_tpu", "pallas_gpu"
from jaxserve.layers.backends import native, pallas_gpu, pallas_tpu, xla  # noqa: E402

__all__ = ["DEFAULT_BACKEND", "AttentionBackend", "available_backends", "get_backend", "native",
           "pallas_gpu", "pallas_tpu", "register_backend", "xla"]
