"""EAGLE-3 draft head (SGLang `LlamaForCausalLMEagle3`, SpecForge/EAGLE checkpoints) in Flax NNX.

Per token the draft takes the target embedding `e` of its input token and a hidden state `h_in`
(as SGLang's `LlamaForCausalLMEagle3` computes it):
1. `h = fc(h_in)` when `h_in` is the concatenation of the target's captured hidden states (width
   `len(aux_layer_ids) * target_hidden`); a later draft step passes the draft's own `hidden`-wide output and
   fc is skipped (decided statically from the width).
2. Midlayer: `a = [input_layernorm(e) ; hidden_norm(h)]` (width 2H); q/k/v from `a` (no bias unless the
   config says so), rotary, full causal attention over the draft's own one-layer KV pool (no window, no
   sinks) through the same paged backend as the target; `h = h + o_proj(.)`;
   `h = h + mlp(post_attention_layernorm(h))` (SwiGLU).
3. `logits = lm_head(norm(h))` over the draft vocabulary; the hidden state handed to the next draft step is
   `h` before the final norm.

Which target layers feed step 1 (`Eagle3Config.aux_layer_ids`): ids mean "output of target layer j" (the
residual stream after layer j, before any norm), the `eagle_config.eagle_aux_hidden_state_layer_ids`
convention of SpecForge and SGLang's draft configs (SGLang stores j + 1 and captures the input of that
layer: the same tensor). It is exactly what `jaxserve.models.decoder.CausalLM` returns as `aux_hidden` when
built with `aux_hidden_state_layer_ids=config.aux_layer_ids`. Without `eagle_config`, SpecForge's default
`[1, L//2 - 1, L - 4]` for an L-layer target applies.

The draft owns no embedding: callers pass the target's embedding matrix (`embed_tokens [vocab, H]`).
Draft ids map to target ids through `d2t` (`jaxserve.speculative.vocab_map`).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxserve.layers.attention_metadata import AttentionMetadata
from jaxserve.layers.backends import DEFAULT_BACKEND, get_backend
from jaxserve.layers.mlp import GatedMLP
from jaxserve.layers.norm import RMSNorm
from jaxserve.layers.rotary import RotaryEmbedding
from jaxserve.memory.kv_pool import KVPool, make_kv_pool, write_kv
from jaxserve.models.weight_spec import WeightSpec
from jaxserve.speculative.eagle3_config import Eagle3Config, default_aux_layer_ids

__all__ = ["Eagle3Config", "Eagle3Draft", "default_aux_layer_ids", "make_draft_forward", "make_draft_pool",
           "random_draft"]

class VocabMap(nnx.Variable):
    """Integer/bool lookup tables loaded with the checkpoint, never trained (`d2t`, `t2d`)."""


class Eagle3Attention(nnx.Module):
    """q/k/v from the 2H-wide `[normed embedding ; normed hidden]`, o_proj back to H."""

    def __init__(self, cfg: Eagle3Config, *, rngs: nnx.Rngs):
        def dense(n_in: int, n_out: int) -> nnx.Linear:
            return nnx.Linear(n_in, n_out, use_bias=cfg.attention_bias, dtype=cfg.jnp_dtype,
                              param_dtype=cfg.jnp_dtype, rngs=rngs)

        width = 2 * cfg.hidden_size
        self.q_proj = dense(width, cfg.num_heads * cfg.head_dim)
        self.k_proj = dense(width, cfg.num_kv_heads * cfg.head_dim)
        self.v_proj = dense(width, cfg.num_kv_heads * cfg.head_dim)
        self.o_proj = dense(cfg.num_heads * cfg.head_dim, cfg.hidden_size)


class Eagle3Layer(nnx.Module):
    """The midlayer's parameters (HF names: `midlayer.{input_layernorm, hidden_norm, self_attn.*,
    post_attention_layernorm, mlp.*}`)."""

    def __init__(self, cfg: Eagle3Config, *, rngs: nnx.Rngs):
        def norm() -> RMSNorm:
            return RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, param_dtype=cfg.jnp_dtype)

        self.input_layernorm = norm()
        self.hidden_norm = norm()
        self.self_attn = Eagle3Attention(cfg, rngs=rngs)
        self.post_attention_layernorm = norm()
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, activation=cfg.hidden_act,
                            dtype=cfg.jnp_dtype, rngs=rngs)


class Eagle3Draft(nnx.Module):
    """The EAGLE-3 head; see the module docstring for the math and `__call__` for the serving contract.

    The pieces (`fuse`, `qkv`, `finish`, `logits`) are public so that training can run the same math with a
    different attention (`jaxserve.training.draft`: the training-time-test unroll).
    """

    ignored_tensors: tuple[str, ...] = ("embed_tokens.weight", "rotary_emb.inv_freq")

    def __init__(self, config: Eagle3Config, *, rngs: nnx.Rngs, backend: str = DEFAULT_BACKEND):
        cfg = config
        dtype = cfg.jnp_dtype
        self.config = cfg
        self.backend = backend
        get_backend(backend)
        self.rotary = RotaryEmbedding.from_params(cfg.rope, cfg.head_dim, cfg.max_position_embeddings)
        self.fc = nnx.Linear(cfg.fc_in_features, cfg.hidden_size, use_bias=False, dtype=dtype,
                             param_dtype=dtype, rngs=rngs)
        self.midlayer = Eagle3Layer(cfg, rngs=rngs)
        self.norm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, param_dtype=dtype)
        self.lm_head = nnx.Linear(cfg.hidden_size, cfg.num_draft_tokens, use_bias=False, dtype=dtype,
                                  param_dtype=dtype, rngs=rngs)
        if cfg.draft_vocab_size is not None:
            self.d2t = VocabMap(jnp.zeros((cfg.draft_vocab_size,), jnp.int32))
            self.t2d = VocabMap(jnp.ones((cfg.vocab_size,), jnp.bool_))

    # ---- checkpoint names ----------------------------------------------------------------------------------
    def weight_specs(self) -> list[WeightSpec]:
        """SpecForge/EAGLE tensor names (no `model.` prefix, q/k/v and gate/up unfused)."""
        specs = [WeightSpec.linear(("fc", "kernel"), "fc.weight"),
                 WeightSpec.copy(("norm", "weight"), "norm.weight"),
                 WeightSpec.linear(("lm_head", "kernel"), "lm_head.weight")]
        for name in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
            specs.append(WeightSpec.copy(("midlayer", name, "weight"), f"midlayer.{name}.weight"))
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            path = ("midlayer", "self_attn", name)
            specs.append(WeightSpec.linear((*path, "kernel"), f"midlayer.self_attn.{name}.weight"))
            if self.config.attention_bias:
                specs.append(WeightSpec.copy((*path, "bias"), f"midlayer.self_attn.{name}.bias"))
        for name in ("gate_proj", "up_proj", "down_proj"):
            path = ("midlayer", "mlp", name, "kernel")
            specs.append(WeightSpec.linear(path, f"midlayer.mlp.{name}.weight"))
        if self.config.draft_vocab_size is not None:
            specs += [WeightSpec.copy(("d2t",), "d2t"), WeightSpec.copy(("t2d",), "t2d")]
        return specs

    # ---- math ----------------------------------------------------------------------------------------------
    def fuse(self, hidden: jax.Array) -> jax.Array:
        """fc for captured target states (width `fc_in_features`); identity for the draft's own state."""
        width = hidden.shape[-1]
        if width == self.config.hidden_size and width != self.config.fc_in_features:
            return hidden
        if width != self.config.fc_in_features:
            raise ValueError(f"draft hidden input has width {width}; expected {self.config.fc_in_features} "
                             f"(captured target states) or {self.config.hidden_size} (draft state)")
        return self.fc(hidden)

    def qkv(self, embeds: jax.Array, hidden: jax.Array, positions: jax.Array):
        """`embeds, hidden [N, H]`, int `positions [N]` -> rotated q `[N, heads, D]`, k, v `[N, kv, D]`."""
        a = self._attn_input(embeds, hidden)
        return (self._q(a, positions), *self._kv(a, positions))

    def _attn_input(self, embeds: jax.Array, hidden: jax.Array) -> jax.Array:
        """`[N, 2H]`: the normed embeddings beside the normed hidden states (what q, k and v project)."""
        layer = self.midlayer
        return jnp.concatenate([layer.input_layernorm(embeds), layer.hidden_norm(hidden)], axis=-1)

    def _q(self, a: jax.Array, positions: jax.Array) -> jax.Array:
        cfg = self.config
        q = self.midlayer.self_attn.q_proj(a).reshape(-1, cfg.num_heads, cfg.head_dim)
        return self.rotary(q, positions)

    def _kv(self, a: jax.Array, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
        cfg, attn = self.config, self.midlayer.self_attn
        k = attn.k_proj(a).reshape(-1, cfg.num_kv_heads, cfg.head_dim)
        return self.rotary(k, positions), attn.v_proj(a).reshape(-1, cfg.num_kv_heads, cfg.head_dim)

    def finish(self, attn_out: jax.Array, hidden: jax.Array) -> jax.Array:
        """`attn_out [..., heads*D]`, residual `hidden [..., H]` -> the pre-norm output state `[..., H]`."""
        layer = self.midlayer
        h = hidden + layer.self_attn.o_proj(attn_out)
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def logits(self, hidden_out: jax.Array) -> jax.Array:
        """Pre-norm state -> float32 logits over the draft vocabulary."""
        return self.lm_head(self.norm(hidden_out)).astype(jnp.float32)

    def __call__(self, input_ids: jax.Array, hidden: jax.Array, meta: AttentionMetadata, pool: KVPool,
                 embedding: jax.Array, *, return_all_logits: bool = False):
        """One ragged draft step of T tokens.

        `input_ids [T]` (target ids), `hidden [T, fc_in_features]` (captured target states) or `[T, H]`
        (the previous draft step's output), `meta` as for the target (the draft reads the full-group slots
        and page table: its KV lives in `pool`, one layer, at the same slot ids as the target's), `embedding
        [vocab, H]` the target's `embed_tokens`. Returns `(logits, hidden_out [T, H], new_pool)`: logits
        float32 `[S, draft_vocab]` at `meta.sample_idx` (or `[T, draft_vocab]` with `return_all_logits`),
        `hidden_out` pre-norm for the next step. Donate `pool` under jit.
        """
        hidden = self.fuse(hidden)
        embeds = jnp.take(embedding, input_ids, axis=0).astype(hidden.dtype)
        q, k, v = self.qkv(embeds, hidden, meta.positions)
        out, pool = get_backend(self.backend)(q, k, v, pool, 0, meta)
        h = self.finish(out.reshape(out.shape[0], -1), hidden)
        return self.logits(h if return_all_logits else h[meta.sample_idx]), h, pool

    def extend(self, input_ids: jax.Array, hidden: jax.Array, meta: AttentionMetadata, pool: KVPool,
               embedding: jax.Array, rows: jax.Array) -> tuple[jax.Array, KVPool]:
        """`__call__` when only some tokens' output states are needed (an extend keeps each sequence's
        last one): the K/V of all T tokens are written, as `__call__` writes them, but attention, o_proj
        and the MLP run over the `rows [R]` (token indices) only. Exact: the draft is one layer, so a
        token's K/V depend on its own input alone, never on another token's attention output. Returns
        `(hidden_out [R, H], new_pool)`, equal to `__call__`'s `hidden_out[rows]`; donate `pool` under jit.
        A prefill extend of T tokens over S sequences then costs the fc and K/V projections of T tokens plus
        one layer over S tokens, instead of the layer over T."""
        hidden = self.fuse(hidden)
        embeds = jnp.take(embedding, input_ids, axis=0).astype(hidden.dtype)
        a = self._attn_input(embeds, hidden)
        r = rows.shape[0]
        k, v = self._kv(a, meta.positions)
        pool = write_kv(pool, 0, meta.write_slots, k, v)  # every token's K/V, before anything reads the pool
        # the rows as a step of their own: same sequences, context and positions (their K/V written again,
        # the same values), so each row sees exactly the keys it sees in the full step
        sub = dataclasses.replace(
            meta, positions=meta.positions[rows], seq_ids=meta.seq_ids[rows],
            write_slots=meta.write_slots[rows],
            swa_write_slots=None if meta.swa_write_slots is None else meta.swa_write_slots[rows],
            custom_mask=None if meta.custom_mask is None else meta.custom_mask[rows],
            sample_idx=jnp.arange(meta.num_seqs, dtype=jnp.int32).clip(max=r - 1))
        out, pool = get_backend(self.backend)(self._q(a[rows], sub.positions), k[rows], v[rows], pool, 0, sub)
        return self.finish(out.reshape(r, -1), hidden[rows]), pool

    # ---- vocabulary ----------------------------------------------------------------------------------------
    def to_target_ids(self, draft_ids: jax.Array) -> jax.Array:
        """Draft-vocabulary ids (any shape) -> target ids: `i + d2t[i]` (identity without a draft vocab)."""
        if self.config.draft_vocab_size is None:
            return draft_ids
        return draft_ids + self.d2t[...][draft_ids]

    def target_vocab_logits(self, draft_logits: jax.Array) -> jax.Array:
        """`[..., draft_vocab]` -> `[..., target_vocab]`, -inf on target ids outside the draft vocabulary."""
        if self.config.draft_vocab_size is None:
            return draft_logits
        ids = self.to_target_ids(jnp.arange(self.config.draft_vocab_size))
        full = jnp.full((*draft_logits.shape[:-1], self.config.vocab_size), -jnp.inf, draft_logits.dtype)
        return full.at[..., ids].set(draft_logits)


def make_draft_pool(config: Eagle3Config, num_pages: int, page_size: int, dtype=jnp.bfloat16) -> KVPool:
    """The draft's one-layer KV pool, with the same page count and size as the target's full group (slot
    ids are shared with the target)."""
    return make_kv_pool(1, num_pages, page_size, config.num_kv_heads, config.head_dim, dtype)


def random_draft(config: Eagle3Config, *, seed: int = 0, backend: str = DEFAULT_BACKEND,
                 vocab_map: tuple[np.ndarray, np.ndarray] | None = None) -> Eagle3Draft:
    """A draft with random parameters (init in one jitted call) and, if given, `(d2t, t2d)` set."""
    def make() -> Eagle3Draft:
        return Eagle3Draft(config, rngs=nnx.Rngs(seed), backend=backend)

    graphdef, _ = nnx.split(nnx.eval_shape(make))
    model = nnx.merge(graphdef, jax.jit(lambda: nnx.state(make()))())
    if vocab_map is not None:
        if config.draft_vocab_size is None:
            raise ValueError("this draft config has no draft_vocab_size, so it takes no vocab map")
        model.d2t[...] = jnp.asarray(vocab_map[0], jnp.int32)
        model.t2d[...] = jnp.asarray(vocab_map[1], jnp.bool_)
    return model



def make_draft_forward(draft: Eagle3Draft):
    """Return `(forward, params)`: `forward(params, input_ids, hidden, meta, pool, embedding,
    return_all_logits=False)` is `Eagle3Draft.__call__` under `jax.jit` with `pool` donated (use the
    returned pool). One compilation per (token, sequence, page) bucket, hidden width and flag."""
    graphdef, params = nnx.split(draft)

    @functools.partial(jax.jit, donate_argnames=("pool",), static_argnames=("return_all_logits",))
    def forward(params, input_ids, hidden, meta, pool, embedding, return_all_logits=False):
        return nnx.merge(graphdef, params)(input_ids, hidden, meta, pool, embedding,
                                           return_all_logits=return_all_logits)

    return forward, params
