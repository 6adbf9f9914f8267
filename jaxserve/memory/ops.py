"""The KV entry points a model step calls, for plain (`KVPool`) and hybrid (`HybridKVPool`) pools alike.

`slots` is an int array `[T]` for a `KVPool` and a `HybridSlots` for a `HybridKVPool`. `layer` indexes the
pool's `data` for a `KVPool` (a Python or traced int, e.g. a `lax.scan` index) and is the model's layer id
(a Python int, static) for a `HybridKVPool`. Contracts, units and layout: see `kv_pool` and `hybrid_pool`.
The `*_donated` versions are jitted with the pool donated (input deleted, output aliases its buffer).
"""

from __future__ import annotations

import jax

from jaxserve.memory import hybrid_pool as H
from jaxserve.memory import kv_pool as P
from jaxserve.memory.hybrid_pool import HybridKVPool, HybridSlots
from jaxserve.memory.kv_pool import KVPool

AnyPool = KVPool | HybridKVPool
AnySlots = jax.Array | HybridSlots


def write_kv(pool: AnyPool, layer, slots: AnySlots, k: jax.Array, v: jax.Array) -> AnyPool:
    """Write one layer's K/V `[T, Hkv, D]` (compute dtype) at `slots`; returns the new pool."""
    if isinstance(pool, HybridKVPool):
        return H.write_kv_hybrid(pool, layer, slots, k, v)
    return P.write_kv(pool, layer, slots, k, v)


def read_kv(pool: AnyPool, layer, slots: AnySlots) -> tuple[jax.Array, jax.Array]:
    """One layer's (k, v) at `slots`, converted from storage (bitcast / dequantized)."""
    if isinstance(pool, HybridKVPool):
        return H.read_kv_hybrid(pool, layer, slots)
    return P.read_kv(pool, layer, slots)


def write_kv_all_layers(pool: AnyPool, slots: AnySlots, k_all: jax.Array, v_all: jax.Array) -> AnyPool:
    """Write every layer's K/V `[num_layers, T, Hkv, D]` (model layer order) in one step."""
    if isinstance(pool, HybridKVPool):
        return H.write_kv_all_layers_hybrid(pool, slots, k_all, v_all)
    return P.write_kv_all_layers(pool, slots, k_all, v_all)


# `layer` is dynamic for KVPool (one compile for every layer); hybrid pools need it static, so they have
# their own entry point.
write_kv_donated = jax.jit(write_kv, donate_argnums=0)
write_kv_hybrid_donated = H.write_kv_hybrid_donated
write_kv_all_layers_donated = jax.jit(write_kv_all_layers, donate_argnums=0)
read_kv_jit = jax.jit(read_kv)
move_kv_donated = jax.jit(P.move_kv, donate_argnums=0)  # plain pools; hybrid: call per group
