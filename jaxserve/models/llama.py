"""Llama (incl. llama3 rope scaling): the generic decoder with `attention_bias` on q/k/v/o and `mlp_bias`."""

from jaxserve.models.decoder import CausalLM


class LlamaForCausalLM(CausalLM):
    """transformers `LlamaForCausalLM`: pre-norm RMSNorm blocks, GQA, SwiGLU, rotary per `rope_parameters`."""
