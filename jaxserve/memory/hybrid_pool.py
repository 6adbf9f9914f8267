"""Hybrid sliding-window pools: full-attention layers on a full pool, sliding-window layers on an SWA pool.

Both groups use the `kv_pool` layout. A static `layer_map[layer_id] = (group, index_in_group)` routes a
model layer to its group ("full" or "swa"). Slots arrive already translated: the host computes
`swa_slots = swa_allocator.swa_slots_of(full_slots)` before the step and passes both as `HybridSlots`, so
the device never needs the full->SWA mapping. Untranslated (0) SWA slots write to the padding page.

Sizing follows SGLang's `--swa-full-tokens-ratio` r: with a budget of `token_layers` per-layer token
entries, `full_tokens = token_layers / (r * num_swa_layers + num_full_layers)` and
`swa_tokens = r * full_tokens` (both rounded down to whole pages).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxserve.memory import kv_pool as P
from jaxserve.memory.errors import KVLayoutError
from jaxserve.memory.kv_pool import KVPool

FULL, SWA = "full", "swa"


@struct.dataclass
class HybridSlots:
    """The slots of one step's tokens in each group: `full[T]` and `swa[T]` (int32)."""

    full: jax.Array
    swa: jax.Array


@struct.dataclass
class HybridKVPool:
    """`{full, swa}` pools plus the static layer map (indexed by model layer id)."""

    full: KVPool
    swa: KVPool
    layer_map: tuple[tuple[str, int], ...] = struct.field(pytree_node=False)

    @property
    def num_layers(self) -> int:
        return len(self.layer_map)

    @property
    def nbytes(self) -> int:
        return self.full.nbytes + self.swa.nbytes

    def group_of(self, layer_id: int) -> tuple[str, int]:
        """(group, index in group) of a model layer; the layer id must be a Python int (static)."""
        if not isinstance(layer_id, int | np.integer):
            raise TypeError("hybrid pools route layers statically: pass layer_id as a Python int")
        if not 0 <= layer_id < len(self.layer_map):
            raise KVLayoutError(f"layer {layer_id} out of range [0, {len(self.layer_map)})")
        return self.layer_map[layer_id]


def hybrid_pool_sizes(
    token_layers: int, swa_full_tokens_ratio: float, num_full_layers: int, num_swa_layers: int, page_size: int
) -> tuple[int, int]:
    """(full_num_pages, swa_num_pages) for a budget of `token_layers` per-layer token entries."""
    if not 0 < swa_full_tokens_ratio <= 1:
        raise KVLayoutError(f"swa_full_tokens_ratio must be in (0, 1], got {swa_full_tokens_ratio}")
    full_tokens = token_layers / (swa_full_tokens_ratio * num_swa_layers + num_full_layers)
    swa_tokens = swa_full_tokens_ratio * full_tokens
    full_pages, swa_pages = int(full_tokens) // page_size, int(swa_tokens) // page_size
    if full_pages < 1 or swa_pages < 1:
        raise KVLayoutError(f"budget of {token_layers} token-layers is too small for one page per group")
    return full_pages, swa_pages


def make_hybrid_kv_pool(
    swa_layer_ids: list[int] | tuple[int, ...],
    num_layers: int,
    full_num_pages: int,
    swa_num_pages: int,
    page_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype=jnp.bfloat16,
    **pool_kwargs,
) -> HybridKVPool:
    """Layers in `swa_layer_ids` go to the SWA pool, the rest of `range(num_layers)` to the full pool."""
    swa_ids = tuple(sorted(set(int(i) for i in swa_layer_ids)))
    if any(not 0 <= i < num_layers for i in swa_ids):
        raise KVLayoutError(f"swa_layer_ids {swa_ids} must lie in [0, {num_layers})")
    full_ids = tuple(i for i in range(num_layers) if i not in swa_ids)
    if not full_ids or not swa_ids:
        raise KVLayoutError("a hybrid pool needs at least one full and one sliding-window layer")
    layer_map = tuple(
        (SWA, swa_ids.index(i)) if i in swa_ids else (FULL, full_ids.index(i)) for i in range(num_layers)
    )
    common = (page_size, num_kv_heads, head_dim, dtype)
    full = P.make_kv_pool(len(full_ids), full_num_pages, *common, layer_ids=full_ids, **pool_kwargs)
    swa = P.make_kv_pool(len(swa_ids), swa_num_pages, *common, layer_ids=swa_ids, **pool_kwargs)
    return HybridKVPool(full, swa, layer_map)


def write_kv_hybrid(
    pool: HybridKVPool, layer_id: int, slots: HybridSlots, k: jax.Array, v: jax.Array
) -> HybridKVPool:
    """Write model layer `layer_id`'s K/V `[T, Hkv, D]` into its group at that group's slots."""
    group, index = pool.group_of(layer_id)
    if group == FULL:
        return pool.replace(full=P.write_kv(pool.full, index, slots.full, k, v))
    return pool.replace(swa=P.write_kv(pool.swa, index, slots.swa, k, v))


def read_kv_hybrid(pool: HybridKVPool, layer_id: int, slots: HybridSlots) -> tuple[jax.Array, jax.Array]:
    """Gather model layer `layer_id`'s K/V at its group's slots."""
    group, index = pool.group_of(layer_id)
    if group == FULL:
        return P.read_kv(pool.full, index, slots.full)
    return P.read_kv(pool.swa, index, slots.swa)


def write_kv_all_layers_hybrid(
    pool: HybridKVPool, slots: HybridSlots, k_all: jax.Array, v_all: jax.Array
) -> HybridKVPool:
    """Write every model layer's K/V `[num_layers, T, Hkv, D]`: one scatter per group."""
    if k_all.shape[0] != pool.num_layers or v_all.shape[0] != pool.num_layers:
        raise KVLayoutError(
            f"k_all/v_all need {pool.num_layers} layers first, got {k_all.shape}, {v_all.shape}"
        )
    full_ids, swa_ids = np.asarray(pool.full.layer_ids), np.asarray(pool.swa.layer_ids)
    full = P.write_kv_all_layers(pool.full, slots.full, k_all[full_ids], v_all[full_ids])
    swa = P.write_kv_all_layers(pool.swa, slots.swa, k_all[swa_ids], v_all[swa_ids])
    return pool.replace(full=full, swa=swa)


write_kv_hybrid_donated = jax.jit(write_kv_hybrid, static_argnums=1, donate_argnums=0)
