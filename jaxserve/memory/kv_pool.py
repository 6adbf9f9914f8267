"""KV pools: one device array per pool, updated functionally inside jitted steps with the pool donated.

Layout: `data[num_layers, num_slots, 2 * num_kv_heads, head_dim]`, K and V interleaved on axis 2
(K = `data[:, :, 0::2]`, V = `data[:, :, 1::2]`). Per layer, `data[l].reshape(num_pages + 1, page_size,
2 * num_kv_heads, head_dim)` is a free reshape into the paged layout the TPU ragged-paged-attention kernel
reads. `num_slots = (num_pages + 1) * page_size`; page 0 (slots `[0, page_size)`) is the padding target:
padded tokens write to slot 0, the allocators never hand it out, and nothing meaningful is read from it.

Storage dtype per logical dtype (`STORAGE_DTYPES`): float32 and float16 as themselves; bfloat16 as uint16
bits, because XLA:CPU scatters into a bf16 array by upcasting the whole pool (O(pool) time, 3x memory), so
writes bitcast the *new* values to uint16 and reads bitcast the *gathered* slice back; float8_e4m3fn as
uint8 bits with one float32 `fp8_scale` per pool: write stores `round_fp8(clip(x / scale, +-448))`, read
returns `float(bits) * scale` in `read_dtype`.

Donation: the `*_donated` entry points (in `ops`) donate the pool; the input array is deleted and the
output aliases its buffer, so a write costs O(tokens written), never O(pool). Inside a larger jitted
step, write a layer's K/V before reading that layer, or XLA inserts a full copy of the pool
(a read of the old pool after the write forces XLA to keep both). Also measured on jax 0.10.2 CPU: in a
Python-unrolled layer loop, a read of layer l that the write of layer l + 1 does not depend on makes XLA
copy the whole pool once per layer (it cannot order the two in place), and so does a `lax.cond` choosing which
pool to write. A real model is safe (layer l + 1's K/V depend on layer l's attention output; the llama step
compiles to no copy), as is a `lax.scan` over layers whose body writes then reads (even two pools per
iteration, one SWA + one full layer). Tests assert "no HLO copy of the pool's shape" on the compiled step.
Out-of-range slots are dropped on write and read as zeros (the host must never pass them).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxserve.memory.errors import KVLayoutError

STORAGE_DTYPES: dict[np.dtype, np.dtype] = {
    np.dtype(jnp.float32): np.dtype(jnp.float32),
    np.dtype(jnp.float16): np.dtype(jnp.float16),
    np.dtype(jnp.bfloat16): np.dtype(jnp.uint16),
    np.dtype(jnp.float8_e4m3fn): np.dtype(jnp.uint8),
}
FP8_MAX = 448.0  # largest finite float8_e4m3fn


@struct.dataclass
class KVPool:
    """A pool group: `data` is the only leaf; everything else is static metadata.

    `layer_ids[i]` is the model's layer id stored at `data[i]` (the index used by `write_kv`/`read_kv`).
    """

    data: jax.Array
    dtype: np.dtype = struct.field(pytree_node=False)
    page_size: int = struct.field(pytree_node=False)
    num_kv_heads: int = struct.field(pytree_node=False)
    head_dim: int = struct.field(pytree_node=False)
    layer_ids: tuple[int, ...] = struct.field(pytree_node=False)
    fp8_scale: float = struct.field(pytree_node=False, default=1.0)
    read_dtype: np.dtype | None = struct.field(pytree_node=False, default=None)

    @property
    def num_layers(self) -> int:
        return self.data.shape[0]

    @property
    def num_slots(self) -> int:
        """Slots including the padding page: `(num_pages + 1) * page_size`."""
        return self.data.shape[1]

    @property
    def num_pages(self) -> int:
        """Allocatable pages (page 0 excluded)."""
        return self.data.shape[1] // self.page_size - 1

    @property
    def storage_dtype(self) -> np.dtype:
        return STORAGE_DTYPES[self.dtype]

    @property
    def output_dtype(self) -> np.dtype:
        """The dtype `read_kv` returns: `read_dtype` if set, else the logical dtype (float32 for fp8)."""
        if self.read_dtype is not None:
            return self.read_dtype
        return np.dtype(jnp.float32) if self.dtype == np.dtype(jnp.float8_e4m3fn) else self.dtype

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.data.shape)) * self.storage_dtype.itemsize


def make_kv_pool(
    num_layers: int,
    num_pages: int,
    page_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype=jnp.bfloat16,
    *,
    layer_ids: tuple[int, ...] | None = None,
    fp8_scale: float = 1.0,
    read_dtype=None,
) -> KVPool:
    """A zero-filled pool with `num_pages` allocatable pages of `page_size` slots (+ padding page 0)."""
    dt = np.dtype(dtype)
    if dt not in STORAGE_DTYPES:
        raise KVLayoutError(f"unsupported KV dtype {dt}; choose one of {[str(d) for d in STORAGE_DTYPES]}")
    dims = {"num_layers": num_layers, "num_pages": num_pages, "page_size": page_size}
    dims |= {"num_kv_heads": num_kv_heads, "head_dim": head_dim}
    bad = {k: v for k, v in dims.items() if v < 1}
    if bad:
        raise KVLayoutError(f"pool dimensions must be >= 1, got {bad}")
    if not fp8_scale > 0:
        raise KVLayoutError(f"fp8_scale must be > 0, got {fp8_scale}")
    ids = tuple(range(num_layers)) if layer_ids is None else tuple(int(i) for i in layer_ids)
    if len(ids) != num_layers:
        raise KVLayoutError(f"{len(ids)} layer_ids for {num_layers} layers")
    shape = (num_layers, (num_pages + 1) * page_size, 2 * num_kv_heads, head_dim)
    data = jnp.zeros(shape, STORAGE_DTYPES[dt])
    rd = None if read_dtype is None else np.dtype(read_dtype)
    return KVPool(data, dt, page_size, num_kv_heads, head_dim, ids, float(fp8_scale), rd)


def _check_kv(pool: KVPool, slots: jax.Array, k: jax.Array, v: jax.Array, lead: tuple[int, ...]) -> None:
    """Static shape/dtype checks (run at trace time): k, v `[*lead, T, Hkv, D]`, slots `[T]` integer."""
    want = (*lead, slots.shape[0] if slots.ndim == 1 else -1, pool.num_kv_heads, pool.head_dim)
    if slots.ndim != 1 or not jnp.issubdtype(slots.dtype, jnp.integer):
        raise KVLayoutError(f"slots must be a 1-D integer array, got shape {slots.shape} dtype {slots.dtype}")
    for name, x in (("k", k), ("v", v)):
        if tuple(x.shape) != want:
            raise KVLayoutError(f"{name} has shape {tuple(x.shape)}; this pool expects {want}")
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise KVLayoutError(f"{name} must be floating point (compute dtype), got {x.dtype}")


def to_storage(pool: KVPool, k: jax.Array, v: jax.Array) -> jax.Array:
    """Interleave K and V on the head axis (`[..., 2 * Hkv, D]`) and convert to the storage dtype."""
    kv = jnp.stack([k, v], axis=-2).reshape(*k.shape[:-2], 2 * pool.num_kv_heads, pool.head_dim)
    if pool.dtype == np.dtype(jnp.bfloat16):
        return jax.lax.bitcast_convert_type(kv.astype(jnp.bfloat16), jnp.uint16)
    if pool.dtype == np.dtype(jnp.float8_e4m3fn):
        scaled = jnp.clip(kv.astype(jnp.float32) / pool.fp8_scale, -FP8_MAX, FP8_MAX)
        return jax.lax.bitcast_convert_type(scaled.astype(jnp.float8_e4m3fn), jnp.uint8)
    return kv.astype(pool.dtype)


def from_storage(pool: KVPool, stored: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Inverse of `to_storage` on a gathered slice `[..., 2 * Hkv, D]`: (k, v) in `pool.output_dtype`."""
    if pool.dtype == np.dtype(jnp.bfloat16):
        kv = jax.lax.bitcast_convert_type(stored, jnp.bfloat16)
    elif pool.dtype == np.dtype(jnp.float8_e4m3fn):
        kv = jax.lax.bitcast_convert_type(stored, jnp.float8_e4m3fn).astype(jnp.float32) * pool.fp8_scale
    else:
        kv = stored
    kv = kv.astype(pool.output_dtype)
    return kv[..., 0::2, :], kv[..., 1::2, :]


def paged_view(pool: KVPool, layer) -> jax.Array:
    """Layer `layer`'s storage as `[num_pages + 1, page_size, 2 * Hkv, D]` (a free reshape), the layout
    ragged-paged-attention kernels read; still in the storage dtype (bitcast/dequantize what you gather)."""
    return pool.data[layer].reshape(pool.num_slots // pool.page_size, pool.page_size, *pool.data.shape[2:])


def write_kv(pool: KVPool, layer, slots: jax.Array, k: jax.Array, v: jax.Array) -> KVPool:
    """Write one layer's K/V `[T, Hkv, D]` at `slots` `[T]`; `layer` indexes `data` (int or traced int)."""
    slots = jnp.asarray(slots)
    _check_kv(pool, slots, k, v, ())
    data = pool.data.at[layer, slots].set(to_storage(pool, k, v), mode="drop")
    return pool.replace(data=data)


def read_kv(pool: KVPool, layer, slots: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Gather one layer's K/V at `slots` (any integer shape `S`): (k, v), each `[*S, Hkv, D]`."""
    slots = jnp.asarray(slots)
    stored = pool.data.at[layer, slots].get(mode="fill", fill_value=0)
    return from_storage(pool, stored)


def move_kv(pool: KVPool, src_slots: jax.Array, dst_slots: jax.Array) -> KVPool:
    """Copy every layer's K/V from `src_slots` to `dst_slots` (`[T]` each; e.g. compacting accepted
    speculative tokens). Ownership is unchanged: the caller frees `src_slots` if it no longer needs them.
    Gather-then-scatter is ordered by data dependence, so a donated pool is updated in place."""
    src, dst = jnp.asarray(src_slots), jnp.asarray(dst_slots)
    if src.shape != dst.shape or src.ndim != 1:
        raise KVLayoutError(f"src_slots and dst_slots must be equal 1-D shapes, got {src.shape}, {dst.shape}")
    data = pool.data.at[:, dst].set(pool.data.at[:, src].get(mode="fill", fill_value=0), mode="drop")
    return pool.replace(data=data)


def write_kv_all_layers(pool: KVPool, slots: jax.Array, k_all: jax.Array, v_all: jax.Array) -> KVPool:
    """Write every layer's K/V `[L, T, Hkv, D]` at the same `slots` `[T]` in one scatter."""
    slots = jnp.asarray(slots)
    _check_kv(pool, slots, k_all, v_all, (pool.num_layers,))
    data = pool.data.at[:, slots].set(to_storage(pool, k_all, v_all), mode="drop")
    return pool.replace(data=data)
