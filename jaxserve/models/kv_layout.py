"""Which KV pool group and index each layer uses.

One group `full` when every layer has the same attention kind (Llama: none slide; Mistral: all slide, the
window is applied by masking). Hybrid models (some layers slide, some do not) get two groups: `full` for the
full-attention layers and `swa` for the sliding layers, each an array
`[num_layers_in_group, num_slots, 2 * num_kv_heads, head_dim]` with its own slot numbering.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxserve.layers.kv_io import storage_dtype
from jaxserve.models.config import FULL, SLIDING, ModelConfig

FULL_GROUP = "full"
SWA_GROUP = "swa"


@dataclasses.dataclass(frozen=True)
class KVLayout:
    """`layer_groups[i] = (group, index_in_group)`; `group_num_layers[g]` layers per group (ordered)."""

    layer_groups: tuple[tuple[str, int], ...]
    group_num_layers: tuple[tuple[str, int], ...]
    num_kv_heads: int
    head_dim: int

    @property
    def groups(self) -> tuple[str, ...]:
        return tuple(g for g, _ in self.group_num_layers)

    @property
    def hybrid(self) -> bool:
        """True when sliding layers live in their own `swa` group (metadata must carry swa tables)."""
        return SWA_GROUP in self.groups

    def pool_shape(self, group: str, num_slots: int) -> tuple[int, int, int, int]:
        return (dict(self.group_num_layers)[group], num_slots, 2 * self.num_kv_heads, self.head_dim)

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> KVLayout:
        hybrid = FULL in cfg.layer_types and SLIDING in cfg.layer_types
        counts: dict[str, int] = {}
        layer_groups = []
        for layer_type in cfg.layer_types:
            group = SWA_GROUP if hybrid and layer_type == SLIDING else FULL_GROUP
            layer_groups.append((group, counts.get(group, 0)))
            counts[group] = counts.get(group, 0) + 1
        order = [g for g in (FULL_GROUP, SWA_GROUP) if g in counts]
        return cls(tuple(layer_groups), tuple((g, counts[g]) for g in order), cfg.num_kv_heads, cfg.head_dim)


def zeros_kv_pools(layout: KVLayout, num_slots: dict[str, int], kv_dtype: jnp.dtype) -> dict[str, jax.Array]:
    """Zero-filled pools `{group: array}` (bf16 K/V stored as uint16); `num_slots[g]` includes the reserved
    page 0. A convenience for tests and tools; the engine's pools come from `jaxserve.memory`."""
    dtype = storage_dtype(kv_dtype)
    return {g: jnp.zeros(layout.pool_shape(g, num_slots[g]), dtype) for g in layout.groups}
