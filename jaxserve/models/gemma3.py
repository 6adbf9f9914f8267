"""Gemma 3 (text): Gemma 2's block plus per-head q/k RMSNorm ((1 + w)), per-layer-type rotary bases and no
attention soft-capping.

- Rotary: `rope_parameters` per layer type (transformers 5), or `rope_theta` (global) + `rope_local_base_freq`
  (sliding) with `rope_scaling` (e.g. linear x8) applying to the global layers only; `ModelConfig.rope_for`
  picks the schedule of each layer's type.
- Layer pattern from `layer_types`, else `sliding_window_pattern` (layer i is global iff (i + 1) % pattern
  == 0; released checkpoints use 6).
- `attn_logit_softcapping` is ignored, as transformers' Gemma3Attention ignores it (released configs set it
  to null; Gemma 3 replaced Gemma 2's soft-cap with q/k norm). `final_logit_softcapping` is honoured.
"""

import dataclasses

from jaxserve.layers.attention import AttentionConfig
from jaxserve.models.gemma2 import Gemma2ForCausalLM


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    """transformers `Gemma3ForCausalLM` (text-only; `Gemma3ForConditionalGeneration` is not served)."""

    qk_norm = True

    def attention_config(self, layer: int) -> AttentionConfig:
        return dataclasses.replace(super().attention_config(layer), logit_softcap=None)
