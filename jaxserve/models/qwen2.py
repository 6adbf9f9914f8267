"""Qwen2: biases on q/k/v (not o); optional sliding window on layers >= `max_window_layers`."""

from jaxserve.models.decoder import CausalLM


class Qwen2ForCausalLM(CausalLM):
    """transformers `Qwen2ForCausalLM`. With `use_sliding_window`, a model with both kinds of layers is
    hybrid: its sliding layers use the `swa` pool group."""

    qkv_bias = True
    o_bias = False
