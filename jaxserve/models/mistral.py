"""Mistral: Llama's block with one sliding window on every layer (HF inclusive window semantics)."""

from jaxserve.models.decoder import CausalLM


class MistralForCausalLM(CausalLM):
    """transformers `MistralForCausalLM`; the window comes from `ModelConfig.layer_types` (all sliding when
    `sliding_window` is set), KV stays in one pool group and the window is applied by masking."""
