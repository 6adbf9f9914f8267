"""Pool-free, differentiable full-sequence forward of a serving `CausalLM`, for training.

The serving forward writes K/V into paged pools and gathers them back per token, which is the right shape
for serving and a wasteful one for training on fixed [batch, length] windows. This forward runs the *same
modules and parameters* (norms, projections, rotary, MoE or MLP, LM head of `jaxserve.models.decoder`) and
replaces only the paged attention call by dense attention over the window, with the native backend's rule:
query at position p sees key j iff j <= p and, on sliding layers, p - j < window; learned sinks add to the
softmax denominator only; scores in float32. `tests/training` checks the logits equal the paged path's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxserve.layers.attention import Attention
from jaxserve.layers.embedding import soft_cap
from jaxserve.models.decoder import CausalLM, DecoderLayer

_MASKED = -1e30


def dense_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, sliding_window: int | None = None,
                    sinks: jax.Array | None = None, logit_softcap: float | None = None,
                    scale: float | None = None) -> jax.Array:
    """Causal GQA attention of `q [B, T, Hq, D]` over `k, v [B, T, Hkv, D]` (positions 0..T-1 in each row).

    Returns `[B, T, Hq, D]` in q's dtype.
    """
    batch, num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[2]
    group = num_q_heads // num_kv_heads
    scale = head_dim ** -0.5 if scale is None else scale
    qg = q.reshape(batch, num_tokens, num_kv_heads, group, head_dim)
    scores = jnp.einsum("bqhgd,bkhd->bhgqk", qg, k, preferred_element_type=jnp.float32) * scale
    scores = soft_cap(scores, logit_softcap)
    pos = jnp.arange(num_tokens)
    visible = pos[None, :] <= pos[:, None]
    if sliding_window is not None:
        visible &= pos[:, None] - pos[None, :] < sliding_window
    scores = jnp.where(visible, scores, _MASKED)
    row_max = scores.max(axis=-1, keepdims=True)
    if sinks is not None:
        sink = sinks.astype(jnp.float32).reshape(1, num_kv_heads, group, 1, 1)
        row_max = jnp.maximum(row_max, sink)
    weights = jnp.where(visible, jnp.exp(scores - row_max), 0.0)
    denom = weights.sum(axis=-1, keepdims=True)
    if sinks is not None:
        denom = denom + jnp.exp(sink - row_max)
    probs = weights / denom
    out = jnp.einsum("bhgqk,bkhd->bqhgd", probs.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return out.reshape(batch, num_tokens, num_q_heads, head_dim).astype(q.dtype)


def _attention(attn: Attention, x: jax.Array, positions: jax.Array) -> jax.Array:
    """`Attention.__call__` with the paged backend replaced by `dense_attention`; x `[B, T, hidden]`."""
    cfg = attn.cfg
    batch, num_tokens, _ = x.shape

    def heads(y: jax.Array, n: int) -> jax.Array:
        return y.reshape(batch * num_tokens, n, cfg.head_dim)

    q, k, v = heads(attn.q_proj(x), cfg.num_heads), heads(attn.k_proj(x), cfg.num_kv_heads), \
        heads(attn.v_proj(x), cfg.num_kv_heads)
    if cfg.qk_norm:
        q, k = attn.q_norm(q), attn.k_norm(k)
    if attn.rotary is not None:
        flat_pos = jnp.broadcast_to(positions, (batch, num_tokens)).reshape(-1)
        q, k = attn.rotary(q, flat_pos), attn.rotary(k, flat_pos)
    out = dense_attention(
        q.reshape(batch, num_tokens, cfg.num_heads, cfg.head_dim),
        k.reshape(batch, num_tokens, cfg.num_kv_heads, cfg.head_dim),
        v.reshape(batch, num_tokens, cfg.num_kv_heads, cfg.head_dim),
        sliding_window=cfg.sliding_window, sinks=attn.sinks[...] if cfg.sinks else None,
        logit_softcap=cfg.logit_softcap, scale=cfg.scale)
    return attn.o_proj(out.reshape(batch, num_tokens, cfg.num_heads * cfg.head_dim))


def _layer(layer: DecoderLayer, x: jax.Array, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`DecoderLayer.__call__` without pools; also returns the MLP input (for router statistics)."""
    h = _attention(layer.attn, layer.input_norm(x), positions)
    if layer.sandwich_norms:
        h = layer.post_attn_norm(h)
    x = x + h
    mlp_in = layer.pre_mlp_norm(x)
    h = layer.mlp(mlp_in)
    if layer.sandwich_norms:
        h = layer.post_mlp_norm(h)
    return x + h, mlp_in


def dense_forward(model: CausalLM, input_ids: jax.Array, *, with_mlp_inputs: bool = False):
    """`input_ids [B, T]` -> `(logits [B, T, vocab] float32, aux [B, T, n * hidden] or None)`, where aux
    follows `CausalLM`'s `aux_hidden_state_layer_ids` convention (output of layer j). With
    `with_mlp_inputs`, a third element lists each layer's normed MLP input `[B, T, hidden]`.
    """
    positions = jnp.arange(input_ids.shape[1], dtype=jnp.int32)[None, :]
    x = model.embed(input_ids)
    captured, mlp_inputs = {}, []
    for i, layer in enumerate(model.layers):
        x, mlp_in = _layer(layer, x, positions)
        mlp_inputs.append(mlp_in)
        if i in model.aux_hidden_state_layer_ids:
            captured[i] = x
    aux = None
    if model.aux_hidden_state_layer_ids:
        aux = jnp.concatenate([captured[j] for j in model.aux_hidden_state_layer_ids], axis=-1)
    logits = model.lm_logits(model.final_norm(x))
    return (logits, aux, mlp_inputs) if with_mlp_inputs else (logits, aux)
