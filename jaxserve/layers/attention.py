"""GQA self-attention: q/k/v projections, optional per-head q/k norm, rotary, paged attention, o_proj."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from jaxserve.layers.attention_metadata import AttentionMetadata
from jaxserve.layers.backends import DEFAULT_BACKEND, get_backend
from jaxserve.layers.norm import RMSNorm
from jaxserve.layers.rotary import RotaryEmbedding
from jaxserve.memory.kv_pool import KVPool


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    """Static shape and behaviour of one attention layer.

    `sliding_window`: keys per query including itself (None = full). `scale`: multiplies q.k (None =
    head_dim**-0.5). `qk_norm`: RMSNorm over head_dim on q and k before rotary (Qwen3, Gemma 3), with
    `norm_unit_offset` for Gemma's (1 + w). `sinks`: one learned logit per q head (gpt-oss).
    """

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    norm_eps: float = 1e-6
    norm_unit_offset: bool = False
    sliding_window: int | None = None
    sinks: bool = False
    logit_softcap: float | None = None
    scale: float | None = None
    backend: str = DEFAULT_BACKEND

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_attention_heads={self.num_heads} is not a multiple of "
                             f"num_key_value_heads={self.num_kv_heads}")


class Attention(nnx.Module):
    """`x [T, hidden] -> [T, hidden]`, writing this step's K/V into layer `layer` of a pool group first.

    Parameters: `q_proj [hidden, H*D]`, `k_proj`/`v_proj [hidden, Hkv*D]`, `o_proj [H*D, hidden]` (+ biases
    per config), optional `q_norm`/`k_norm [D]`, optional `sinks [H]`.
    """

    def __init__(self, cfg: AttentionConfig, rotary: RotaryEmbedding | None, *, dtype: jnp.dtype,
                 rngs: nnx.Rngs):
        def dense(n_in: int, n_out: int, bias: bool) -> nnx.Linear:
            return nnx.Linear(n_in, n_out, use_bias=bias, dtype=dtype, param_dtype=dtype, rngs=rngs)

        h, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.cfg = cfg
        self.rotary = rotary
        self.q_proj = dense(cfg.hidden_size, h * d, cfg.qkv_bias)
        self.k_proj = dense(cfg.hidden_size, hkv * d, cfg.qkv_bias)
        self.v_proj = dense(cfg.hidden_size, hkv * d, cfg.qkv_bias)
        self.o_proj = dense(h * d, cfg.hidden_size, cfg.o_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(d, eps=cfg.norm_eps, unit_offset=cfg.norm_unit_offset, param_dtype=dtype)
            self.k_norm = RMSNorm(d, eps=cfg.norm_eps, unit_offset=cfg.norm_unit_offset, param_dtype=dtype)
        if cfg.sinks:
            self.sinks = nnx.Param(jnp.zeros((h,), dtype))
        self.mesh: Mesh | None = None  # set by jaxserve.models.sharding.set_mesh: attend under shard_map
        get_backend(cfg.backend)  # unknown name fails at construction

    def qkv(self, x: jax.Array, positions: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Projections of `x [T, hidden]` at `positions [T]`: q `[T, H, D]`, k and v `[T, Hkv, D]`, with
        q/k norm and rotary applied (what the backend receives; reusable by pool-free forwards)."""
        cfg = self.cfg
        num_tokens = x.shape[0]
        q = self.q_proj(x).reshape(num_tokens, cfg.num_heads, cfg.head_dim)
        k = self.k_proj(x).reshape(num_tokens, cfg.num_kv_heads, cfg.head_dim)
        v = self.v_proj(x).reshape(num_tokens, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary is not None:
            q, k = self.rotary(q, positions), self.rotary(k, positions)
        return q, k, v

    def __call__(self, x: jax.Array, meta: AttentionMetadata, pool: KVPool, layer: int, *,
                 use_swa_tables: bool = False) -> tuple[jax.Array, KVPool]:
        """`pool` is the group holding this layer (index `layer` in it, an int or traced int);
        `use_swa_tables` when that group is the swa group of a hybrid pool (its own slots and page table).

        A pool with more kv heads than the layer (a multiple: kv heads replicated for tensor parallelism)
        gets each kv head repeated that many times. With `self.mesh` set, the backend runs under
        `jax.shard_map` over its `tp` axis: q, k, v, sinks and the pool split on heads, the metadata
        replicated; each shard attends its own heads (GQA groups never straddle shards)."""
        cfg = self.cfg
        q, k, v = self.qkv(x, meta.positions)
        if pool.num_kv_heads != cfg.num_kv_heads:
            k = jnp.repeat(k, pool.num_kv_heads // cfg.num_kv_heads, axis=1)
            v = jnp.repeat(v, pool.num_kv_heads // cfg.num_kv_heads, axis=1)
        sinks = self.sinks[...] if cfg.sinks else None
        backend = functools.partial(get_backend(cfg.backend), use_swa_tables=use_swa_tables,
                                    sliding_window=cfg.sliding_window, logit_softcap=cfg.logit_softcap,
                                    scale=cfg.scale)
        if self.mesh is None:
            out, pool = backend(q, k, v, pool, layer, meta, sinks=sinks)
        else:
            out, pool = _sharded(backend, self.mesh, q, k, v, pool, layer, meta, sinks)
        return self.o_proj(out.reshape(x.shape[0], cfg.num_heads * cfg.head_dim)), pool


def _sharded(backend, mesh: Mesh, q: jax.Array, k: jax.Array, v: jax.Array, pool: KVPool, layer,
             meta: AttentionMetadata, sinks: jax.Array | None) -> tuple[jax.Array, KVPool]:
    """`backend` per shard of `mesh`'s `tp` axis on head-split q/k/v/sinks and a head-split pool."""
    tp = mesh.shape["tp"]
    heads, pool_heads = P(None, "tp", None), P(None, None, "tp", None)

    def local(q, k, v, data, layer, meta, sinks):
        shard = pool.replace(data=data, num_kv_heads=pool.num_kv_heads // tp)
        out, shard = backend(q, k, v, shard, layer, meta, sinks=sinks)
        return out, shard.data

    specs = (heads, heads, heads, pool_heads, P(), P(), P() if sinks is None else P("tp"))
    # check_vma=False: a backend's loops start from constants (running max, zero accumulators) that become
    # head-sharded values inside the loop; the per-shard program is the same either way
    out, data = jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=(heads, pool_heads),
                              check_vma=False)(
        q, k, v, pool.data, jnp.asarray(layer, jnp.int32), meta, sinks)
    return out, pool.replace(data=data)
