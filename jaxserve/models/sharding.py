"""Tensor parallelism over a `jax.sharding.Mesh` with one axis `tp`: which parameter dimension each shard
holds, and the KV pools sharded on kv heads.

Parameters (`param_spec`, Megatron-style; a dimension that `tp` does not divide stays replicated):
- q/k/v projections and the gated MLP's gate/up: column-parallel (kernel `[in, out]` -> `P(None, "tp")`,
  bias `P("tp")`); o_proj and down_proj: row-parallel (kernel `P("tp", None)`, bias replicated, XLA adds
  the all-reduce); k/v when `num_kv_heads < tp`: replicated (every shard computes all kv heads, keeps its
  own, see below);
- gpt-oss experts, on the same devices, as `ep_size` says (`expert_parallel_sizes`): ep = tp (the
  default) shards whole experts (`[E, ...]` -> `P("tp", ...)`: each shard holds E/tp experts); ep = 1
  shards every expert's intermediate dimension instead (gate_up_proj `[E, H, 2I]` and its bias on the 2I
  columns, down_proj `[E, I, H]` on I: row-parallel, its bias replicated; gate/up columns are interleaved,
  so a block of 2I/tp columns holds whole (gate, up) pairs, the same I/tp rows of down_proj); an ep
  strictly between splits both ways on `expert_mesh`, the tp devices viewed as `("ep", "etp")` =
  (ep, tp/ep) in the same order: ep groups of tp/ep consecutive devices, group g holding experts
  [g E/ep, (g+1) E/ep), each device of a group 1/(tp/ep) of their intermediate dimension as at ep 1
  (down_proj's bias replicated). At every ep the layer's all-reduces are of its [tokens, hidden] output
  (`layers.moe.experts_dense` contracts experts and intermediate dimension in one einsum and adds the
  down bias after); router replicated; sinks `[H]` follow their q heads;
- embedding `[V, H]`: vocab-parallel `P("tp", None)`; lm_head kernel `[H, V]`: `P(None, "tp")`;
- norms: replicated.

KV pools (`tp_layout`, `pool_sharding`): `[L, slots, 2 * Hkv', D]` sharded on the head axis, so each
shard holds 1/tp of every pool. When `num_kv_heads < tp` the layout stores `Hkv' = tp` heads: kv head j
repeated `tp / Hkv` times (as SGLang replicates kv heads), so shard r holds the one kv head its q heads use;
the attention layer repeats k/v to `Hkv'` heads before the write (`Attention.__call__`).

Attention runs under `jax.shard_map` per shard (`set_mesh`): q and the pool are head-sharded, the step's
metadata replicated, and each shard runs the registered backend on its own heads with no collective.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxserve.layers.attention import Attention
from jaxserve.models.config import ModelConfig
from jaxserve.models.decoder import CausalLM
from jaxserve.models.kv_layout import KVLayout, KVPools
from jaxserve.models.weight_spec import ParamPath

TP = "tp"
EP, ETP = "ep", "etp"  # the axes of `expert_mesh`: expert groups, and tp within a group
_COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
_ROW = ("o_proj", "down_proj")
_EXPERTS = ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")


def make_tp_mesh(tp_size: int) -> Mesh:
    """A 1-D mesh `("tp",)` over the first `tp_size` devices (ValueError when fewer exist)."""
    devices = jax.devices()
    if not 1 <= tp_size <= len(devices):
        raise ValueError(f"tp_size={tp_size} needs that many devices; {len(devices)} are visible")
    return Mesh(np.asarray(devices[:tp_size]), (TP,), axis_types=(AxisType.Auto,))


def expert_parallel_sizes(tp: int) -> tuple[int, ...]:
    """The `ep_size` values a `tp`-way mesh takes, largest first: the divisors of tp - tp (whole experts
    per shard), 1 (every expert split on its intermediate dimension) and those between (both)."""
    return tuple(ep for ep in range(tp, 0, -1) if tp % ep == 0)


def expert_mesh(mesh: Mesh, ep: int) -> Mesh:
    """The devices of the 1-D `("tp",)` `mesh` as a 2-D `("ep", "etp")` mesh of shape (ep, tp/ep), in the
    same order (so one program may mix shardings on both meshes): row g is expert group g."""
    return Mesh(mesh.devices.reshape(ep, -1), (EP, ETP), axis_types=(AxisType.Auto,) * 2)


def param_spec(config: ModelConfig, path: ParamPath, shape: tuple[int, ...], tp: int,
               ep: int | None = None) -> P:
    """The PartitionSpec of parameter `path` (as `CausalLM.weight_specs` names it) of `shape`; see the
    module docstring for the table. `ep`: the expert-parallel size (None: tp); a spec naming `"ep"` or
    `"etp"` is over `expert_mesh(mesh, ep)` (1 < ep < tp), any other over the `("tp",)` mesh. A dimension
    its axis does not divide stays replicated (`None` in the spec; `P()` on the tp mesh)."""
    ep = tp if ep is None else ep
    if ep not in expert_parallel_sizes(tp):
        raise ValueError(f"ep_size={ep} with tp_size={tp}; choose one of {list(expert_parallel_sizes(tp))}")
    names = tuple(str(p) for p in path)
    leaf, owner = names[-1], names[-2] if len(names) > 1 else ""

    def on(axis: int) -> P:
        if shape[axis] % tp:
            return P()
        return P(*([None] * axis), TP, *([None] * (len(shape) - axis - 1)))

    if owner in ("k_proj", "v_proj") and config.num_kv_heads % tp:
        return P()
    if owner in _COLUMN:  # kernel [in, out] and bias [out]: the output features
        return on(len(shape) - 1)
    if owner in _ROW:  # kernel [in, out]: the input features; the bias is added once, after the reduce
        return on(0) if leaf == "kernel" else P()
    if owner == "mlp" and leaf in _EXPERTS and 1 < ep < tp:  # experts on ep, intermediate on etp
        if leaf == "down_proj_bias":  # replicated as at ep 1: each device adds its tokens' bias locally
            return P()
        experts = EP if shape[0] % ep == 0 else None
        intermediate = shape[1] if leaf == "down_proj" else shape[-1] // 2  # gate_up: 2I interleaved
        inner = ETP if intermediate % (tp // ep) == 0 else None
        if leaf == "down_proj":
            return P(experts, inner, None)
        return P(experts, *([None] * (len(shape) - 2)), inner)
    if owner == "mlp" and leaf in _EXPERTS and ep != tp:  # ep 1: each expert's intermediate dimension
        intermediate = shape[1] if leaf == "down_proj" else shape[-1] // 2  # gate_up: 2I interleaved
        if leaf == "down_proj_bias" or intermediate % tp:
            return P()
        return on(1) if leaf == "down_proj" else on(len(shape) - 1)
    if (owner == "mlp" and leaf in _EXPERTS) or leaf == "sinks" or names[:2] == ("embed", "embed"):
        return on(0)
    if names[0] == "lm_head":
        return on(1)
    return P()


def sharding_for(config: ModelConfig, mesh: Mesh, ep_size: int | None = None):
    """The loader's `sharding_for(path, shape)` hook placing every parameter by `param_spec` on `mesh`
    (`ep_size`: see `param_spec`; an expert spec on `("ep", "etp")` is placed on `expert_mesh`)."""
    tp = mesh.shape[TP]
    ep = tp if ep_size is None else ep_size

    def place(path: ParamPath, shape: tuple[int, ...]) -> NamedSharding:
        spec = param_spec(config, path, shape, tp, ep_size)
        return NamedSharding(expert_mesh(mesh, ep) if {EP, ETP} & set(spec) else mesh, spec)

    return place


def tp_layout(layout: KVLayout, tp: int) -> KVLayout:
    """`layout` with kv heads repeated up to `tp` when it has fewer (a multiple of them is required)."""
    if layout.num_kv_heads >= tp:
        if layout.num_kv_heads % tp:
            raise ValueError(f"num_kv_heads={layout.num_kv_heads} is not a multiple of tp_size={tp}")
        return layout
    if tp % layout.num_kv_heads:
        raise ValueError(f"tp_size={tp} is not a multiple of num_kv_heads={layout.num_kv_heads}")
    return dataclasses.replace(layout, num_kv_heads=tp)


def pool_sharding(mesh: Mesh) -> NamedSharding:
    """Pool data `[L, slots, 2 * Hkv', D]` split on the (interleaved K/V) head axis.

    Spelled without the trailing `None`, exactly as a jitted step reports the pools it returns: the
    executable of a step is chosen by its arguments' shardings compared as written
    (`engine.runner.Programs`), so a pool made with `P(None, None, TP, None)` compiled each step twice
    (once for the fresh pool, once for the equal-in-effect pool the first step returned)."""
    return NamedSharding(mesh, P(None, None, TP))


def make_sharded_pools(layout: KVLayout, mesh: Mesh, num_pages: int, page_size: int, dtype, *,
                       swa_num_pages: int | None = None) -> KVPools:
    """`layout.make_pools(...)` with every group's data created sharded by `pool_sharding` (each shard
    zero-fills its own part: no full pool on one device). Shard r holds heads [r * Hkv' / tp, ...), K and V
    of a head side by side (the interleaved axis splits between heads; `tp_layout` makes Hkv' divisible)."""
    make = jax.jit(lambda: layout.make_pools(num_pages, page_size, dtype, swa_num_pages=swa_num_pages),
                   out_shardings=pool_sharding(mesh))
    return make()


def shard_model(model: CausalLM, mesh: Mesh, ep_size: int | None = None) -> CausalLM:
    """An unstacked `model` (e.g. built with random weights) with every parameter moved to its
    `param_spec` sharding on `mesh` and its attention set to run under shard_map; in place. A checkpoint
    is placed at load time instead (`load_model(..., sharding_for=sharding_for(config, mesh))`)."""
    place = sharding_for(model.config, mesh, ep_size)
    flat = nnx.to_flat_state(nnx.state(model))
    leaves = [jax.device_put(x, place(path, x.shape))
              for path, x in zip(flat.paths, flat.leaves, strict=True)]
    nnx.update(model, nnx.from_flat_state(nnx.FlatState.from_sorted_keys_values(flat.paths, leaves)))
    return set_mesh(model, mesh)


def set_mesh(model: CausalLM, mesh: Mesh | None) -> CausalLM:
    """Run `model`'s attention layers under `jax.shard_map` over `mesh` (None: plain jit), in place."""
    for _, module in nnx.iter_graph(model):
        if isinstance(module, Attention):
            module.mesh = mesh
    return model
