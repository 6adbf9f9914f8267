"""Write/read K/V in a pool group array `[num_layers_in_group, num_slots, 2 * num_kv_heads, head_dim]`.

K and V are interleaved on axis 2 (K = 0::2, V = 1::2). bf16 K/V is stored as uint16 bits (XLA:CPU scatters
bf16 by upcasting the whole pool); other float dtypes are stored as themselves. Only the gathered slice is
bitcast back, so a donated pool stays O(written) per write.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def storage_dtype(kv_dtype: jnp.dtype) -> jnp.dtype:
    """Pool element dtype for K/V of `kv_dtype` (bf16 -> uint16 bits)."""
    return jnp.dtype(jnp.uint16) if jnp.dtype(kv_dtype) == jnp.bfloat16 else jnp.dtype(kv_dtype)


def _to_storage(x: jax.Array, pool_dtype: jnp.dtype) -> jax.Array:
    if pool_dtype == jnp.uint16:
        return jax.lax.bitcast_convert_type(x.astype(jnp.bfloat16), jnp.uint16)
    return x.astype(pool_dtype)


def _from_storage(x: jax.Array) -> jax.Array:
    if x.dtype == jnp.uint16:
        return jax.lax.bitcast_convert_type(x, jnp.bfloat16)
    return x


def write_kv(pool: jax.Array, layer: int, slots: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """Store `k, v [T, kv_heads, head_dim]` at `slots [T]` of group layer `layer`; returns the new pool.

    Call this before any read of the same pool in a donated step (a read of the old pool forces a copy).
    """
    num_tokens, num_kv_heads, head_dim = k.shape
    kv = jnp.stack([k, v], axis=2).reshape(num_tokens, 2 * num_kv_heads, head_dim)
    return pool.at[layer, slots].set(_to_storage(kv, pool.dtype))


def read_kv(pool: jax.Array, layer: int, slots: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Gather `slots [...]` of group layer `layer`: returns `(k, v)` each `[..., kv_heads, head_dim]`."""
    kv = _from_storage(pool[layer, slots])
    return kv[..., 0::2, :], kv[..., 1::2, :]
