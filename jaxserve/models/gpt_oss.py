"""gpt-oss: the generic decoder with attention biases, one learned sink logit per head on every layer,
YaRN rotary, alternating sliding (window 128 keys incl. self) / full layers, and a top-k MoE as the MLP.

The config (Hugging Face `GptOssConfig`) carries `layer_types`, `sliding_window`,
`rope_parameters` (yarn, `truncate: false`), `num_local_experts`, `num_experts_per_tok`, `swiglu_limit`,
`swiglu_alpha`. Expert weights load from plain tensors (`mlp.experts.gate_up_proj [E, H, 2I]`, ...) or, when
`quantization_config.quant_method` is `mxfp4` (the Hub checkpoints), from `*_blocks` / `*_scales` pairs,
dequantized on the host one tensor at a time (`jaxserve.models.mxfp4`).
"""

from __future__ import annotations

import functools

from flax import nnx

from jaxserve.layers.moe import Dispatch, GptOssMoE
from jaxserve.models.config import ConfigError
from jaxserve.models.decoder import CausalLM
from jaxserve.models.mxfp4 import dequantize_experts
from jaxserve.models.weight_spec import WeightSpec


def is_mxfp4(raw_config) -> bool:
    """True when config.json declares MXFP4 expert weights (`quantization_config.quant_method`)."""
    quant = raw_config.get("quantization_config") or {}
    method = quant.get("quant_method")
    if method not in (None, "mxfp4"):
        raise ConfigError(f"config field 'quantization_config.quant_method' = {method!r} is not supported "
                          f"for gpt-oss; supported: 'mxfp4' or none")
    return method == "mxfp4"


class GptOssForCausalLM(CausalLM):
    """transformers `GptOssForCausalLM`. Hybrid KV: sliding layers use the `swa` pool group."""

    attention_sinks = True
    moe_dispatch: Dispatch = "auto"  # see jaxserve.layers.moe

    def make_mlp(self, layer: int, rngs: nnx.Rngs) -> nnx.Module:
        cfg = self.config
        if not cfg.num_local_experts or not cfg.num_experts_per_tok:
            raise ConfigError("gpt-oss config needs 'num_local_experts' and 'num_experts_per_tok'")
        is_mxfp4(cfg.raw)  # an unsupported quantization fails at construction, before any loading
        return GptOssMoE(
            cfg.hidden_size, cfg.intermediate_size, cfg.num_local_experts, cfg.num_experts_per_tok,
            swiglu_limit=cfg.swiglu_limit if cfg.swiglu_limit is not None else 7.0,
            swiglu_alpha=float(cfg.raw.get("swiglu_alpha", 1.702)), dispatch=self.moe_dispatch,
            dtype=cfg.jnp_dtype, rngs=rngs)

    def mlp_weight_specs(self, layer: int, prefix: str) -> list[WeightSpec]:
        path = ("layers", layer, "mlp")
        specs = [WeightSpec.copy((*path, "router_weight"), f"{prefix}router.weight"),
                 WeightSpec.copy((*path, "router_bias"), f"{prefix}router.bias")]
        mxfp4 = is_mxfp4(self.config.raw)
        for name in ("gate_up_proj", "down_proj"):
            source = f"{prefix}experts.{name}"
            specs.append(WeightSpec.copy((*path, f"{name}_bias"), f"{source}_bias"))
            if mxfp4:
                # dequantized straight into the parameter dtype: no float32 copy of the whole tensor
                dequantize = functools.partial(dequantize_experts, dtype=self.config.jnp_dtype, name=source)
                specs.append(WeightSpec((*path, name), (f"{source}_blocks", f"{source}_scales"), dequantize))
            else:
                specs.append(WeightSpec.copy((*path, name), source))
        return specs

