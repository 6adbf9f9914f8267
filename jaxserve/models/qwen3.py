"""Qwen3: per-head RMSNorm on q and k before rotary; `attention_bias` (usually false) on q/k/v/o."""

from jaxserve.models.decoder import CausalLM


class Qwen3ForCausalLM(CausalLM):
    """transformers `Qwen3ForCausalLM` (dense)."""

    qk_norm = True
