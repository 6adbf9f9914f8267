"""Which KV pool group each layer uses, and pool construction for a model.

One group (`jaxserve.memory.KVPool`) when every layer has the same attention kind (Llama: none slide;
Mistral: all slide, the window is applied by masking). Hybrid models (some layers slide, some do not) get a
`jaxserve.memory.HybridKVPool`: `full` for the full-attention layers and `swa` for the sliding layers, each
`[num_layers_in_group, num_slots, 2 * num_kv_heads, head_dim]` with its own slot numbering. A hybrid model
also runs on a single `KVPool` (every layer then reads full-group tables and masks its window).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxserve.memory.hybrid_pool import HybridKVPool, make_hybrid_kv_pool
from jaxserve.memory.kv_pool import KVPool, make_kv_pool
from jaxserve.models.config import SLIDING, ModelConfig

KVPools = KVPool | HybridKVPool


@dataclasses.dataclass(frozen=True)
class KVLayout:
    """`swa_layer_ids`: layers placed in the swa group (empty unless the model is hybrid)."""

    num_layers: int
    swa_layer_ids: tuple[int, ...]
    num_kv_heads: int
    head_dim: int

    @property
    def hybrid(self) -> bool:
        """True when sliding layers get their own `swa` group (metadata must then carry swa tables)."""
        return bool(self.swa_layer_ids)

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> KVLayout:
        sliding = tuple(i for i, t in enumerate(cfg.layer_types) if t == SLIDING)
        hybrid = 0 < len(sliding) < cfg.num_layers
        return cls(cfg.num_layers, sliding if hybrid else (), cfg.num_kv_heads, cfg.head_dim)

    def make_pools(self, num_pages: int, page_size: int, dtype: jnp.dtype = jnp.bfloat16, *,
                   swa_num_pages: int | None = None) -> KVPools:
        """Zero-filled pools: a `KVPool` of `num_pages` pages, or for a hybrid layout a `HybridKVPool` with
        `num_pages` full pages and `swa_num_pages` (default `num_pages`) swa pages; page 0 is reserved."""
        if not self.hybrid:
            return make_kv_pool(self.num_layers, num_pages, page_size, self.num_kv_heads, self.head_dim,
                                dtype)
        return make_hybrid_kv_pool(self.swa_layer_ids, self.num_layers, num_pages,
                                   swa_num_pages or num_pages, page_size, self.num_kv_heads,
                                   self.head_dim, dtype)


def route_layer(pools: KVPools, layer: int) -> tuple[str, int]:
    """`(group, index_in_group)` of model layer `layer` in `pools` (group "full" or "swa")."""
    return pools.group_of(layer) if isinstance(pools, HybridKVPool) else ("full", layer)


def group_pool(pools: KVPools, group: str) -> KVPool:
    return getattr(pools, group) if isinstance(pools, HybridKVPool) else pools


def replace_group(pools: KVPools, group: str, pool: KVPool) -> KVPools:
    return pools.replace(**{group: pool}) if isinstance(pools, HybridKVPool) else pool


def pool_arrays(pools: KVPools) -> list[jax.Array]:
    """The device arrays of `pools` (for tests that check donation)."""
    return jax.tree.leaves(pools)
