"""Generic decoder-only causal LM: embedding, a stack of pre-norm attention + MLP blocks, final norm, LM head.

Architectures subclass `CausalLM` and adjust it through class attributes and a few hook methods
(`attention_config`, `make_mlp`, `mlp_weight_specs`, `weight_specs`), never by copying the forward pass.

Call contract (`CausalLM.__call__`), for a ragged step of T tokens from S sequences:
    logits, new_kv_pools, aux_hidden = model(input_ids [T] int32, meta, kv_pools, return_all_logits=False)
- `logits`: float32 `[S, vocab]` at `meta.sample_idx`, or `[T, vocab]` with `return_all_logits`.
- `kv_pools`: a `jaxserve.memory.KVPool` or `HybridKVPool` (see `KVLayout.make_pools`); every layer
  writes its K/V first, then reads; the returned pools replace the input (donate them under jit).
- `layers`: an `nnx.List` of `DecoderLayer`s run as an unrolled loop, or after `scan_layers` a
  `jaxserve.models.layer_stack.LayerStack` run as one `jax.lax.scan` (same results).
- `aux_hidden`: `[T, len(ids) * hidden]` concatenation, in `aux_hidden_state_layer_ids` order, of the
  residual stream at the OUTPUT of each listed layer j (= the input of layer j+1, before any norm): the
  EAGLE-3 `eagle_aux_hidden_state_layer_ids` convention (SpecForge; SGLang stores j+1 and captures
  the input of that layer - the same tensor). None when no ids are configured.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jaxserve.layers.attention import Attention, AttentionConfig
from jaxserve.layers.attention_metadata import AttentionMetadata
from jaxserve.layers.backends import DEFAULT_BACKEND
from jaxserve.layers.embedding import Embedding, soft_cap
from jaxserve.layers.mlp import GatedMLP
from jaxserve.layers.norm import RMSNorm
from jaxserve.layers.rotary import RotaryEmbedding
from jaxserve.memory.kv_pool import KVPool
from jaxserve.models.config import ModelConfig
from jaxserve.models.kv_layout import KVLayout, KVPools
from jaxserve.models.layer_stack import LayerStack, apply_layer, layer_period
from jaxserve.models.weight_spec import WeightSpec


class DecoderLayer(nnx.Module):
    """Pre-norm block: `x + [post_attn_norm](attn(input_norm(x)))`, then
    `+ [post_mlp_norm](mlp(pre_mlp_norm(.)))`; the bracketed norms exist with `sandwich_norms` (Gemma)."""

    def __init__(self, attn: Attention, mlp: nnx.Module, hidden_size: int, *, eps: float,
                 unit_offset: bool, sandwich_norms: bool, dtype: jnp.dtype):
        def norm() -> RMSNorm:
            return RMSNorm(hidden_size, eps=eps, unit_offset=unit_offset, param_dtype=dtype)

        self.input_norm = norm()
        self.attn = attn
        self.pre_mlp_norm = norm()
        self.mlp = mlp
        self.sandwich_norms = sandwich_norms
        if sandwich_norms:
            self.post_attn_norm = norm()
            self.post_mlp_norm = norm()

    def __call__(self, x: jax.Array, meta: AttentionMetadata, pool: KVPool, layer: int, *,
                 use_swa_tables: bool = False) -> tuple[jax.Array, KVPool]:
        h, pool = self.attn(self.input_norm(x), meta, pool, layer, use_swa_tables=use_swa_tables)
        if self.sandwich_norms:
            h = self.post_attn_norm(h)
        x = x + h
        h = self.mlp(self.pre_mlp_norm(x))
        if self.sandwich_norms:
            h = self.post_mlp_norm(h)
        return x + h, pool


class CausalLM(nnx.Module):
    """Decoder-only LM built from a `ModelConfig`; see the module docstring for the call contract.

    Class attributes an architecture may override: `qkv_bias`/`o_bias` (None = `config.attention_bias`),
    `qk_norm`, `norm_unit_offset` (Gemma (1 + w)), `sandwich_norms`, `embed_scale` (sqrt(hidden)),
    `attention_sinks`, `ignored_tensors` (checkpoint names to skip, as suffixes).
    """

    qkv_bias: bool | None = None
    o_bias: bool | None = None
    qk_norm: bool = False
    norm_unit_offset: bool = False
    sandwich_norms: bool = False
    embed_scale: bool = False
    attention_sinks: bool = False
    ignored_tensors: tuple[str, ...] = ("rotary_emb.inv_freq",)

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, backend: str = DEFAULT_BACKEND,
                 aux_hidden_state_layer_ids: Sequence[int] = ()):
        dtype = config.jnp_dtype
        self.config = config
        self.kv_layout = KVLayout.from_config(config)
        self.backend = backend
        self.aux_hidden_state_layer_ids = tuple(aux_hidden_state_layer_ids)
        for j in self.aux_hidden_state_layer_ids:
            if not 0 <= j < config.num_layers:
                raise ValueError(f"aux_hidden_state_layer_ids entry {j} is outside [0, {config.num_layers})")
        self.embed = Embedding(config.vocab_size, config.hidden_size, scale_by_sqrt_dim=self.embed_scale,
                               dtype=dtype, rngs=rngs)
        self.layers = nnx.List([self._make_layer(i, rngs) for i in range(config.num_layers)])
        self.final_norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps,
                                  unit_offset=self.norm_unit_offset, param_dtype=dtype)
        if not config.tie_word_embeddings:
            self.lm_head = nnx.Linear(config.hidden_size, config.vocab_size, use_bias=False, dtype=dtype,
                                      param_dtype=dtype, rngs=rngs)

    # ---- hooks -------------------------------------------------------------------------------------------
    def attention_config(self, layer: int) -> AttentionConfig:
        cfg = self.config
        bias = cfg.attention_bias
        return AttentionConfig(
            hidden_size=cfg.hidden_size, num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim, qkv_bias=bias if self.qkv_bias is None else self.qkv_bias,
            o_bias=bias if self.o_bias is None else self.o_bias, qk_norm=self.qk_norm,
            norm_eps=cfg.rms_norm_eps, norm_unit_offset=self.norm_unit_offset,
            sliding_window=cfg.window_of(layer), sinks=self.attention_sinks,
            logit_softcap=cfg.attn_logit_softcapping,
            scale=cfg.query_pre_attn_scalar ** -0.5 if cfg.query_pre_attn_scalar else None,
            backend=self.backend)

    def rotary(self, layer: int) -> RotaryEmbedding | None:
        cfg = self.config
        return RotaryEmbedding.from_params(cfg.rope_for(layer), cfg.head_dim, cfg.max_position_embeddings)

    def make_mlp(self, layer: int, rngs: nnx.Rngs) -> nnx.Module:
        cfg = self.config
        return GatedMLP(cfg.hidden_size, cfg.intermediate_size, activation=cfg.hidden_act,
                        use_bias=cfg.mlp_bias, dtype=cfg.jnp_dtype, rngs=rngs)

    def mlp_weight_specs(self, layer: int, prefix: str) -> list[WeightSpec]:
        """Specs for `layers/{layer}/mlp`; `prefix` is e.g. `model.layers.0.mlp.`."""
        specs = []
        for name in ("gate_proj", "up_proj", "down_proj"):
            path = ("layers", layer, "mlp", name)
            specs.append(WeightSpec.linear((*path, "kernel"), f"{prefix}{name}.weight"))
            if self.config.mlp_bias:
                specs.append(WeightSpec.copy((*path, "bias"), f"{prefix}{name}.bias"))
        return specs

    def weight_specs(self) -> list[WeightSpec]:
        """Every parameter's checkpoint source(s), with HF transformers' tensor names."""
        cfg = self.config
        specs = [WeightSpec.copy(("embed", "embed", "embedding"), "model.embed_tokens.weight"),
                 WeightSpec.copy(("final_norm", "weight"), "model.norm.weight")]
        if not cfg.tie_word_embeddings:
            specs.append(WeightSpec.linear(("lm_head", "kernel"), "lm_head.weight"))
        norms = {"input_layernorm": "input_norm", "post_attention_layernorm": "pre_mlp_norm"}
        if self.sandwich_norms:
            norms = {"input_layernorm": "input_norm", "post_attention_layernorm": "post_attn_norm",
                     "pre_feedforward_layernorm": "pre_mlp_norm",
                     "post_feedforward_layernorm": "post_mlp_norm"}
        for i in range(cfg.num_layers):
            pre = f"model.layers.{i}."
            for hf, ours in norms.items():
                specs.append(WeightSpec.copy(("layers", i, ours, "weight"), f"{pre}{hf}.weight"))
            acfg = self.attention_config(i)
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                path = ("layers", i, "attn", name)
                specs.append(WeightSpec.linear((*path, "kernel"), f"{pre}self_attn.{name}.weight"))
                if acfg.o_bias if name == "o_proj" else acfg.qkv_bias:
                    specs.append(WeightSpec.copy((*path, "bias"), f"{pre}self_attn.{name}.bias"))
            if acfg.qk_norm:
                for name in ("q_norm", "k_norm"):
                    specs.append(WeightSpec.copy(("layers", i, "attn", name, "weight"),
                                                 f"{pre}self_attn.{name}.weight"))
            if acfg.sinks:
                specs.append(WeightSpec.copy(("layers", i, "attn", "sinks"), f"{pre}self_attn.sinks"))
            specs.extend(self.mlp_weight_specs(i, f"{pre}mlp."))
        return specs

    # ---- forward -----------------------------------------------------------------------------------------
    def _make_layer(self, layer: int, rngs: nnx.Rngs) -> DecoderLayer:
        cfg = self.config
        attn = Attention(self.attention_config(layer), self.rotary(layer), dtype=cfg.jnp_dtype, rngs=rngs)
        return DecoderLayer(attn, self.make_mlp(layer, rngs), cfg.hidden_size, eps=cfg.rms_norm_eps,
                            unit_offset=self.norm_unit_offset, sandwich_norms=self.sandwich_norms,
                            dtype=cfg.jnp_dtype)

    def lm_logits(self, x: jax.Array) -> jax.Array:
        """Final-normed hidden `[N, hidden]` -> float32 logits `[N, vocab]` (final soft-cap applied)."""
        logits = self.embed.attend(x) if self.config.tie_word_embeddings else self.lm_head(x)
        return soft_cap(logits.astype(jnp.float32), self.config.final_logit_softcapping)

    def __call__(self, input_ids: jax.Array, meta: AttentionMetadata, kv_pools: KVPools, *,
                 return_all_logits: bool = False) -> tuple[jax.Array, KVPools, jax.Array | None]:
        pools = kv_pools
        x = self.embed(input_ids)
        if isinstance(self.layers, LayerStack):
            x, pools, captured = self.layers.run(x, meta, pools, capture=self.aux_hidden_state_layer_ids)
        else:
            captured = {}
            for i, layer in enumerate(self.layers):
                x, pools = apply_layer(layer, x, meta, pools, i)
                if i in self.aux_hidden_state_layer_ids:
                    captured[i] = x
        aux = None
        if self.aux_hidden_state_layer_ids:
            aux = jnp.concatenate([captured[j] for j in self.aux_hidden_state_layer_ids], axis=-1)
        x = self.final_norm(x)
        if not return_all_logits:
            x = x[meta.sample_idx]
        return self.lm_logits(x), pools, aux


def scan_layers(model: CausalLM) -> CausalLM:
    """A model computing what `model` computes, with its layers as one `jax.lax.scan` over stacked
    parameters (`jaxserve.models.layer_stack`): compile time no longer grows with depth.

    `model` is not modified; the new model shares its embedding, final norm and LM head and holds stacked
    copies of the layer parameters (drop `model` to free its own). Returned unchanged when its layers are
    already stacked, or when its layer pattern does not repeat at least twice (e.g. Qwen2's
    full-then-sliding `max_window_layers`), where a scan would have a single iteration.
    """
    if isinstance(model.layers, LayerStack):
        return model
    period = layer_period(list(model.layers))
    if len(model.layers) // period < 2:
        return model
    scanned = nnx.merge(*nnx.split(model))
    scanned.layers = LayerStack(list(scanned.layers), period)
    return scanned
