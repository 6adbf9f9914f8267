"""Reading a dispatched step's results on the host: the one helper both steppers read results with.

On a CPU backend a result array already lives in host memory, and `np.asarray` returns it in ~3 us; the
generic `jax.device_get` (a pytree walk plus an asynchronous copy request per array) costs ~30 us for two
small arrays there, measured on the 2-core CPU machine: ~1% of a decode step, on every step. On an
accelerator each array is its own device-to-host copy, so all copies are started before the first wait,
overlapping their latencies (what `jax.device_get` does, without the pytree walk).
"""

from __future__ import annotations

import functools

import jax
import numpy as np


@functools.cache
def _host_is_device() -> bool:
    return jax.default_backend() == "cpu"


def to_host(*arrays: jax.Array) -> tuple[np.ndarray, ...]:
    """The arrays as numpy arrays (waits for the computations that produce them), one per argument."""
    if not _host_is_device():
        for a in arrays:
            a.copy_to_host_async()
    return tuple(np.asarray(a) for a in arrays)
