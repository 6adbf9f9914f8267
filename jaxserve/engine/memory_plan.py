"""Device memory planning for `--mem-fraction-static F`: how many KV pages fit, as SGLang sizes its pools.

The plan, all figures per device in bytes:
- `static = F * device_total`: what weights and KV pools may take together (SGLang's meaning of F; the
  rest, `(1 - F) * device_total`, is left to activations, the runtime and fragmentation);
- `budget = min(static - weights, free - activation)`: the KV pools also leave the measured activation
  peak of the largest step bucket free (`free` is measured after the weights are on the device);
- a single pool of `num_pages` pages (+ the padding page 0) takes
  `(num_pages + 1) * page_size * layers * 2 * kv_heads * head_dim * itemsize`; a hybrid model splits
  `budget` between its full and SWA groups with `--swa-full-tokens-ratio` r
  (`jaxserve.memory.hybrid_pool.hybrid_pool_sizes`: swa tokens = r * full tokens);
- `headroom = free - pools`: what is left once the pools are allocated (at least the activation peak).

`device_memory()` reads JAX's allocator figures (`bytes_limit`, `bytes_in_use`) on accelerators; a CPU
reports none, so there the host's physical and available memory stand in (`/proc/meminfo`).
"""

from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from jaxserve.engine.step_input import padding_meta
from jaxserve.memory.hybrid_pool import hybrid_pool_sizes
from jaxserve.memory.kv_pool import STORAGE_DTYPES
from jaxserve.models.decoder import CausalLM
from jaxserve.models.kv_layout import KVLayout
from jaxserve.models.sharding import pool_sharding
from jaxserve.models.step import make_forward

GIB = 1 << 30


class MemoryPlanError(ValueError):
    """The device cannot hold the weights, the activation peak and one KV page per pool group."""


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """The sizes `plan_kv_pools` chose (bytes per device; pages of `page_size` slots, padding page
    excluded). `swa_num_pages` is None for a single-pool model."""

    fraction: float
    device_bytes: int
    free_bytes: int
    weight_bytes: int
    activation_bytes: int
    page_size: int
    num_pages: int
    swa_num_pages: int | None
    pool_bytes: int

    @property
    def max_total_tokens(self) -> int:
        """Token slots of the full pool (what `--max-total-tokens` would have set)."""
        return self.num_pages * self.page_size

    @property
    def headroom_bytes(self) -> int:
        return self.free_bytes - self.pool_bytes

    def describe(self) -> str:
        """One line for the start-up log."""
        swa = "" if self.swa_num_pages is None else f" + swa {self.swa_num_pages * self.page_size} tokens"
        return (f"memory plan (--mem-fraction-static {self.fraction}): device "
                f"{self.device_bytes / GIB:.2f} GiB, weights {self.weight_bytes / GIB:.3f} GiB, activations "
                f"{self.activation_bytes / GIB:.3f} GiB (largest bucket), KV pools "
                f"{self.pool_bytes / GIB:.3f} GiB, headroom {self.headroom_bytes / GIB:.3f} GiB; "
                f"{self.max_total_tokens} tokens fit{swa}")


def pool_page_bytes(layout: KVLayout, page_size: int, kv_dtype: np.dtype) -> int:
    """Bytes of one page in one layer: `page_size * 2 * kv_heads * head_dim * storage itemsize`."""
    itemsize = STORAGE_DTYPES[np.dtype(kv_dtype)].itemsize
    return page_size * 2 * layout.num_kv_heads * layout.head_dim * itemsize


def plan_kv_pools(layout: KVLayout, *, fraction: float, device_bytes: int, free_bytes: int, weight_bytes: int,
                  activation_bytes: int, page_size: int, kv_dtype: np.dtype,
                  swa_full_tokens_ratio: float = 1.0) -> MemoryPlan:
    """Pool sizes from the formula in the module docstring; MemoryPlanError when not one page fits."""
    if not 0 < fraction < 1:
        raise MemoryPlanError(f"mem_fraction_static={fraction} must be in (0, 1)")
    budget = min(int(fraction * device_bytes) - weight_bytes, free_bytes - activation_bytes)
    page = pool_page_bytes(layout, page_size, kv_dtype)
    num_layers, num_swa = layout.num_layers, len(layout.swa_layer_ids)
    usable = budget - page * num_layers  # every layer's padding page 0 comes first
    swa_pages = None
    try:
        if usable < page * num_layers:
            raise MemoryPlanError("no KV page fits")
        if layout.hybrid:
            pages, swa_pages = hybrid_pool_sizes(usable // page * page_size, swa_full_tokens_ratio,
                                                 num_layers - num_swa, num_swa, page_size)
        else:
            pages = usable // (page * num_layers)
    except ValueError as e:
        raise MemoryPlanError(
            f"{e}: device {device_bytes} B, free {free_bytes} B after weights of {weight_bytes} B, "
            f"activation peak {activation_bytes} B, mem_fraction_static {fraction} leave {budget} B for KV "
            f"pools (one page of every layer: {page * num_layers} B)") from None
    full_layers = num_layers - num_swa
    pool_bytes = page * ((pages + 1) * full_layers + ((swa_pages or 0) + 1) * num_swa)
    return MemoryPlan(fraction, device_bytes, free_bytes, weight_bytes, activation_bytes, page_size, pages,
                      swa_pages, pool_bytes)


def device_memory(device: jax.Device | None = None) -> tuple[int, int]:
    """`(total, free)` bytes of `device` (default: the first); on a CPU, the host's physical and available
    memory."""
    device = device or jax.devices()[0]
    stats = device.memory_stats()
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"]), int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        free = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return int(total), int(free)


def weight_bytes_per_device(model: CausalLM, device: jax.Device | None = None) -> int:
    """Bytes of `model`'s arrays held on `device` (default: the first device): the shards it holds."""
    device = device or jax.devices()[0]
    return sum(shard.data.nbytes for leaf in jax.tree.leaves(nnx.state(model))
               for shard in leaf.addressable_shards if shard.device == device)


def activation_peak_bytes(model: CausalLM, layout: KVLayout, *, num_tokens: int, num_seqs: int,
                          num_pages: int, page_size: int, kv_dtype: np.dtype,
                          mesh: Mesh | None = None) -> int:
    """XLA's temporary-buffer size (per device) of `model`'s forward for one bucket over pools of `layout`
    (sharded by `models.sharding.pool_sharding` on `mesh` when given), compiled from shapes only: no pool
    is allocated. The activation peak of a step of that size."""
    forward, params = make_forward(model)
    pools = jax.eval_shape(lambda: layout.make_pools(num_pages * num_seqs, page_size, kv_dtype))
    if mesh is not None:
        sharding = pool_sharding(mesh)
        pools = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), pools)
    meta = padding_meta(num_tokens, num_seqs, num_pages, page_size=page_size, hybrid=layout.hybrid)
    compiled = forward.lower(params, np.zeros(num_tokens, np.int32), meta, pools).compile()
    return int(compiled.memory_analysis().temp_size_in_bytes)
