"""A tiny EAGLE-3 config, random drafts with perturbed vectors, and an independent numpy reference of the
draft math (`jaxserve.speculative.eagle3_draft`'s docstring states it), written from the HF-named tensors."""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from jaxserve.layers.attention_metadata import SequenceStep, build_attention_metadata
from jaxserve.speculative.eagle3_checkpoint import eagle3_tensors
from jaxserve.speculative.eagle3_draft import Eagle3Config, Eagle3Draft, make_draft_pool, random_draft
from jaxserve.speculative.vocab_map import build_vocab_map

VOCAB, DRAFT_VOCAB, HIDDEN = 96, 40, 32
AUX_IDS = (0, 1, 2)


def tiny_draft_config(**overrides) -> Eagle3Config:
    raw = dict(architectures=["LlamaForCausalLMEagle3"], hidden_size=HIDDEN, intermediate_size=48,
               num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=VOCAB,
               draft_vocab_size=DRAFT_VOCAB, rms_norm_eps=1e-5, max_position_embeddings=512, rope_theta=500.0,
               eagle_config={"eagle_aux_hidden_state_layer_ids": list(AUX_IDS)})
    raw.update(overrides)
    return Eagle3Config.from_dict(raw)


def tiny_draft(config: Eagle3Config | None = None, seed: int = 0, scale: float = 3.0) -> Eagle3Draft:
    config = config or tiny_draft_config()
    rng = np.random.default_rng(seed)
    vocab_map = None
    if config.draft_vocab_size is not None:
        vocab_map = build_vocab_map(rng.integers(0, 1000, config.vocab_size), config.draft_vocab_size)
    model = random_draft(config, seed=seed, vocab_map=vocab_map)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    leaves, treedef = jax.tree.flatten(params)
    leaves = [x + rng.normal(0, 0.3, x.shape).astype(np.float32) if x.ndim == 1 else x * scale
              for x in leaves]
    return nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves), rest)


# ---- independent numpy reference ------------------------------------------------------------------------
def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope(x, positions, theta):
    d = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, d, 2) / d)
    ang = positions[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def reference_step(t: dict, cfg: Eagle3Config, embedding, ids, hidden, positions, cache=None):
    """Draft over tokens at `positions` (attending causally to `cache` keys first, then each other).
    `cache`: dict with 'k', 'v', 'pos' lists, extended in place. Returns (draft logits, hidden_out)."""
    eps = cfg.rms_norm_eps
    h = hidden @ t["fc.weight"].T if hidden.shape[-1] != cfg.hidden_size else hidden
    e = embedding[ids]
    a = np.concatenate([_rms(e, t["midlayer.input_layernorm.weight"], eps),
                        _rms(h, t["midlayer.hidden_norm.weight"], eps)], axis=-1)
    n, nh, nkv, d = len(ids), cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    q = _rope((a @ t["midlayer.self_attn.q_proj.weight"].T).reshape(n, nh, d), positions, cfg.rope.theta)
    k = _rope((a @ t["midlayer.self_attn.k_proj.weight"].T).reshape(n, nkv, d), positions, cfg.rope.theta)
    v = (a @ t["midlayer.self_attn.v_proj.weight"].T).reshape(n, nkv, d)
    cache = cache if cache is not None else {"k": [], "v": [], "pos": []}
    cache["k"].extend(k)
    cache["v"].extend(v)
    cache["pos"].extend(positions)
    keys, values, kpos = np.stack(cache["k"]), np.stack(cache["v"]), np.asarray(cache["pos"])
    out = np.zeros((n, nh, d))
    for i in range(n):
        visible = np.arange(len(kpos)) < len(kpos) - n + i + 1  # earlier cache entries and itself
        for head in range(nh):
            kv = head // (nh // nkv)
            s = keys[visible, kv] @ q[i, head] / np.sqrt(d)
            p = np.exp(s - s.max())
            out[i, head] = (p / p.sum()) @ values[visible, kv]
    h1 = h + out.reshape(n, nh * d) @ t["midlayer.self_attn.o_proj.weight"].T
    x = _rms(h1, t["midlayer.post_attention_layernorm.weight"], eps)
    gate, up = x @ t["midlayer.mlp.gate_proj.weight"].T, x @ t["midlayer.mlp.up_proj.weight"].T
    h2 = h1 + (gate / (1 + np.exp(-gate)) * up) @ t["midlayer.mlp.down_proj.weight"].T
    logits = _rms(h2, t["norm.weight"], eps) @ t["lm_head.weight"].T
    return logits, h2


def reference_tensors(model: Eagle3Draft) -> dict:
    tensors = eagle3_tensors(model)
    return {k: np.asarray(v, np.float64) if v.dtype.kind == "f" else v for k, v in tensors.items()}


# ---- serving path helpers -------------------------------------------------------------------------------
def run_paged(model: Eagle3Draft, embedding, chunks, *, page_size: int = 1, num_pages: int = 64):
    """Feed one sequence in `chunks` [(ids, hidden), ...] through the paged draft; returns per-chunk
    (all logits, hidden_out) as numpy."""
    pool = make_draft_pool(model.config, num_pages, page_size, np.float32)
    pages = list(np.random.default_rng(0).permutation(num_pages)[: num_pages // 2] + 1)
    outs, done = [], 0
    for ids, hidden in chunks:
        n = len(ids)
        meta = build_attention_metadata([SequenceStep(n, done + n, pages)], page_size=page_size,
                                        token_buckets=(16, 32, 64), page_buckets=(32 // page_size,))
        pad = meta.num_tokens - n
        ids_p = np.pad(np.asarray(ids, np.int32), (0, pad))
        hid_p = np.pad(np.asarray(hidden, np.float32), ((0, pad), (0, 0)))
        logits, h, pool = model(ids_p, hid_p, meta, pool, embedding, return_all_logits=True)
        outs.append((np.asarray(logits)[:n], np.asarray(h)[:n]))
        done += n
    return outs
