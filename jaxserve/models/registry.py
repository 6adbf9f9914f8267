"""HF `architectures[0]` -> model class, imported lazily so one model's import cost or bug stays local."""

from __future__ import annotations

import importlib

from jaxserve.models.decoder import CausalLM

_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "jaxserve.models.llama:LlamaForCausalLM",
    "Qwen2ForCausalLM": "jaxserve.models.qwen2:Qwen2ForCausalLM",
    "Qwen3ForCausalLM": "jaxserve.models.qwen3:Qwen3ForCausalLM",
    "MistralForCausalLM": "jaxserve.models.mistral:MistralForCausalLM",
    "Gemma2ForCausalLM": "jaxserve.models.gemma2:Gemma2ForCausalLM",
    "Gemma3ForCausalLM": "jaxserve.models.gemma3:Gemma3ForCausalLM",
    "GptOssForCausalLM": "jaxserve.models.gpt_oss:GptOssForCausalLM",
}


class UnsupportedArchitectureError(ValueError):
    """config.json names an architecture jaxserve has no model for."""


def supported_architectures() -> list[str]:
    return sorted(_ARCHITECTURES)


def model_class(architecture: str) -> type[CausalLM]:
    """Class for an HF architecture name; UnsupportedArchitectureError lists the supported ones."""
    try:
        target = _ARCHITECTURES[architecture]
    except KeyError:
        raise UnsupportedArchitectureError(
            f"architecture {architecture!r} (config.json 'architectures') is not supported; supported: "
            f"{', '.join(supported_architectures())}") from None
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)
