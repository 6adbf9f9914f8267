"""Paged-attention backends, selected by name.

A backend is a callable with the signature of `native.paged_attention`: it writes the step's K/V into one
layer of a pool group, then attends every query token over its sequence's cached keys, and returns
`(out [T, q_heads, head_dim], new_pool)`. Kernels register themselves with `@register_backend("name")`;
models pick one by name:

- `native`: the plain-JAX reference (gathers every key index of the page table per token), the test oracle;
- `xla`: ragged paged attention in plain JAX (work follows the real context, not the bucket);
- `pallas_tpu` / `pallas_gpu`: our Pallas kernels (Mosaic TPU / Triton), for their platform only;
- `auto` (`DEFAULT_BACKEND`): resolved when a model first calls it, from the platform of JAX's default
  device: `pallas_tpu` on a TPU, `pallas_gpu` on a GPU, `CPU_DEFAULT` on a CPU. Resolving late keeps
  importing jaxserve from initialising JAX's backends (multi-host programs must call
  `jax.distributed.initialize` first).

On a CPU `auto` means `xla`: its work follows each sequence's real context, where `native` pays for the
whole page-table width on every query token. `native` stays registered as the test oracle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

AttentionBackend = Callable[..., Any]

_BACKENDS: dict[str, AttentionBackend] = {}
AUTO = "auto"
DEFAULT_BACKEND = AUTO
CPU_DEFAULT = "xla"
_PLATFORM_DEFAULT = {"tpu": "pallas_tpu", "gpu": "pallas_gpu", "cpu": CPU_DEFAULT}


def register_backend(name: str) -> Callable[[AttentionBackend], AttentionBackend]:
    """Decorator registering a backend under `name`; re-registering a name raises ValueError."""

    def wrap(fn: AttentionBackend) -> AttentionBackend:
        if name in _BACKENDS and _BACKENDS[name] is not fn:
            raise ValueError(f"attention backend {name!r} is already registered")
        _BACKENDS[name] = fn
        return fn

    return wrap


def platform_default(platform: str | None = None) -> str:
    """The backend `auto` means on `platform` ("cpu", "gpu", "tpu"; None: JAX's default device's platform,
    ROCm and CUDA counting as "gpu"); unknown platforms get the CPU choice."""
    if platform is None:
        import jax

        platform = jax.default_backend()
        platform = "gpu" if platform in ("cuda", "rocm") else platform
    return _PLATFORM_DEFAULT.get(platform, CPU_DEFAULT)


def resolve_backend_name(name: str, platform: str | None = None) -> str:
    """`name` itself, or for `auto` the platform's default (`platform_default`)."""
    return platform_default(platform) if name == AUTO else name


def get_backend(name: str) -> AttentionBackend:
    """Return the backend registered as `name` (`auto`: the platform's default); ValueError lists the
    registered names otherwise."""
    if name == AUTO:
        name = platform_default()
    try:
        return _BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown attention backend {name!r}; registered: {sorted(_BACKENDS)}") from None


def available_backends() -> list[str]:
    """The registered backend names (without `auto`, which names one of them)."""
    return sorted(_BACKENDS)


# register "native", "xla" and the Pallas kernels "pallas_tpu", "pallas_gpu"
from jaxserve.layers.backends import native, pallas_gpu, pallas_tpu, xla  # noqa: E402

__all__ = ["AUTO", "CPU_DEFAULT", "DEFAULT_BACKEND", "AttentionBackend", "available_backends", "get_backend",
           "native", "pallas_gpu", "pallas_tpu", "platform_default", "register_backend",
           "resolve_backend_name", "xla"]
