"""Gemma 2: the generic decoder with Gemma's sandwich norms, (1 + w) RMSNorm, sqrt(hidden)-scaled embeddings,
attention and final logit soft-capping, `query_pre_attn_scalar`, GeGLU (gelu tanh) MLP and tied embeddings.

Everything here is a switch of `jaxserve.models.decoder.CausalLM`; the config carries the rest:
`layer_types` (even layers slide when absent), `sliding_window` (keys including self),
`attn_logit_softcapping` / `final_logit_softcapping`, `query_pre_attn_scalar` (scores scale
`query_pre_attn_scalar ** -0.5`), `hidden_activation`, `tie_word_embeddings`.
"""

import dataclasses

from flax import nnx

from jaxserve.models.config import ModelConfig
from jaxserve.models.decoder import CausalLM


class Gemma2ForCausalLM(CausalLM):
    """transformers `Gemma2ForCausalLM`. Sliding and full layers alternate, so the model is hybrid: its
    sliding layers use the `swa` pool group. Each block is `x + post_attention_norm(attn(input_norm(x)))`,
    then `+ post_feedforward_norm(mlp(pre_feedforward_norm(.)))`.
    """

    norm_unit_offset = True
    sandwich_norms = True
    embed_scale = True

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, **kwargs):
        # transformers' Gemma configs default to tied embeddings, and transformers 4 leaves a field equal to
        # the default out of config.json: an absent `tie_word_embeddings` means tied here.
        if config.raw and "tie_word_embeddings" not in config.raw:
            config = dataclasses.replace(config, tie_word_embeddings=True)
        super().__init__(config, rngs=rngs, **kwargs)
