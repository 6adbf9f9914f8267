"""Typed model configuration parsed from a Hugging Face `config.json`.

Accepts both spellings HF has used: transformers 5 writes `rope_parameters` (with `rope_theta` inside, or one
dict per layer type) and `dtype`; Hub checkpoints carry `rope_scaling` + `rope_theta` and `torch_dtype`.
Errors raise `ConfigError` naming the field.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax.numpy as jnp

from jaxserve.layers.rotary import RopeParams

FULL = "full_attention"
SLIDING = "sliding_attention"
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


class ConfigError(ValueError):
    """config.json is missing a field or has a value jaxserve cannot serve."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture hyper-parameters (frozen and hashable: models keep it as a static attribute).

    `layer_types[i]` is FULL or SLIDING; `rope` pairs a layer type with its rotary schedule (sliding layers
    use the `full_attention` schedule unless the checkpoint gives one per type). `raw` is the parsed JSON,
    for architecture-specific fields; it takes no part in equality or hashing.
    """

    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    layer_types: tuple[str, ...]
    sliding_window: int | None
    rope: tuple[tuple[str, RopeParams], ...]
    max_position_embeddings: int | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    hidden_act: str = "silu"
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    query_pre_attn_scalar: float | None = None
    num_local_experts: int | None = None
    num_experts_per_tok: int | None = None
    swiglu_limit: float | None = None
    dtype: str = "float32"
    raw: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False, hash=False)

    @property
    def jnp_dtype(self) -> jnp.dtype:
        return jnp.dtype(_DTYPES[self.dtype])

    def window_of(self, layer: int) -> int | None:
        """Sliding window (keys including self) of layer `layer`, or None for full attention."""
        return self.sliding_window if self.layer_types[layer] == SLIDING else None

    def rope_for(self, layer: int) -> RopeParams:
        rope = dict(self.rope)
        return rope.get(self.layer_types[layer], rope[FULL])

    def with_dtype(self, dtype: str) -> ModelConfig:
        if dtype not in _DTYPES:
            raise ConfigError(f"dtype {dtype!r} is not supported; supported: {sorted(_DTYPES)}")
        return dataclasses.replace(self, dtype=dtype)

    @classmethod
    def from_file(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"no config.json at {path}") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path} is not valid JSON: {e}") from None
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ModelConfig:
        """Parse an HF config dict (text models; Gemma 3 multimodal configs pass their `text_config`)."""
        raw = dict(raw)
        archs = raw.get("architectures") or []
        if not archs:
            raise ConfigError("config field 'architectures' is missing or empty")

        def need(name: str) -> Any:
            if raw.get(name) is None:
                raise ConfigError(f"config field {name!r} is missing (architecture {archs[0]})")
            return raw[name]

        num_layers = int(need("num_hidden_layers"))
        num_heads = int(need("num_attention_heads"))
        hidden = int(need("hidden_size"))
        head_dim = raw.get("head_dim") or hidden // num_heads
        dtype = raw.get("dtype") or raw.get("torch_dtype") or "float32"
        if dtype not in _DTYPES:
            raise ConfigError(f"config field 'dtype'/'torch_dtype' = {dtype!r} is not supported")
        layer_types = _layer_types(raw, num_layers)
        sliding_window = raw.get("sliding_window")
        if SLIDING in layer_types and not sliding_window:
            raise ConfigError("config has sliding-attention layers but field 'sliding_window' is missing")
        return cls(
            architecture=archs[0], model_type=raw.get("model_type", ""),
            vocab_size=int(need("vocab_size")), hidden_size=hidden,
            intermediate_size=int(need("intermediate_size")), num_layers=num_layers, num_heads=num_heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or num_heads), head_dim=int(head_dim),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)), layer_types=layer_types,
            sliding_window=int(sliding_window) if SLIDING in layer_types else None,
            rope=tuple(_rope(raw).items()), max_position_embeddings=raw.get("max_position_embeddings"),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=bool(raw.get("attention_bias", False)), mlp_bias=bool(raw.get("mlp_bias", False)),
            hidden_act=raw.get("hidden_act") or raw.get("hidden_activation") or "silu",
            attn_logit_softcapping=raw.get("attn_logit_softcapping"),
            final_logit_softcapping=raw.get("final_logit_softcapping"),
            query_pre_attn_scalar=raw.get("query_pre_attn_scalar"),
            num_local_experts=raw.get("num_local_experts"),
            num_experts_per_tok=raw.get("num_experts_per_tok"),
            swiglu_limit=raw.get("swiglu_limit"), dtype=dtype, raw=raw)


def _layer_types(raw: Mapping[str, Any], num_layers: int) -> tuple[str, ...]:
    """Which layers slide, in HF's order of precedence: explicit `layer_types`; Qwen2's
    `use_sliding_window` + `max_window_layers` (layers >= max_window_layers slide); `sliding_window_pattern`
    (layer i is full iff (i+1) % pattern == 0); Gemma 2 without layer_types (even layers slide); any other
    non-null `sliding_window` (Mistral: every layer slides)."""
    if raw.get("layer_types") is not None:
        types = tuple(raw["layer_types"])
        if len(types) != num_layers:
            raise ConfigError(f"config field 'layer_types' has {len(types)} entries, num_hidden_layers is "
                              f"{num_layers}")
        unknown = set(types) - {FULL, SLIDING}
        if unknown:
            raise ConfigError(f"config field 'layer_types' has unsupported entries {sorted(unknown)}")
        return types
    window = raw.get("sliding_window")
    if "use_sliding_window" in raw:
        if not raw["use_sliding_window"] or window is None:
            return (FULL,) * num_layers
        first = int(raw.get("max_window_layers", num_layers))
        return tuple(SLIDING if i >= first else FULL for i in range(num_layers))
    if window is None:
        return (FULL,) * num_layers
    if raw.get("sliding_window_pattern"):
        pattern = int(raw["sliding_window_pattern"])
        return tuple(FULL if (i + 1) % pattern == 0 else SLIDING for i in range(num_layers))
    if raw.get("model_type") == "gemma2":
        return tuple(SLIDING if i % 2 == 0 else FULL for i in range(num_layers))
    return (SLIDING,) * num_layers


_ROPE_KEYS = {f.name for f in dataclasses.fields(RopeParams)} - {"rope_type", "theta"}


def _rope_params(d: Mapping[str, Any], default_theta: float, what: str) -> RopeParams:
    kind = d.get("rope_type") or d.get("type") or "default"
    theta = d.get("rope_theta", default_theta)
    kwargs = {k: d[k] for k in _ROPE_KEYS if d.get(k) is not None}
    try:
        return RopeParams(rope_type=kind, theta=float(theta), **kwargs)
    except ValueError as e:
        raise ConfigError(f"config field {what!r}: {e}") from None


def _rope(raw: Mapping[str, Any]) -> dict[str, RopeParams]:
    """`{layer_type: RopeParams}` from `rope_parameters` (flat or per layer type) or `rope_scaling` +
    `rope_theta` (+ Gemma 3's `rope_local_base_freq` for sliding layers)."""
    theta = float(raw.get("rope_theta") or 10000.0)
    params = raw.get("rope_parameters")
    if isinstance(params, Mapping) and params and all(isinstance(v, Mapping) for v in params.values()):
        out = {lt: _rope_params(p, theta, f"rope_parameters.{lt}") for lt, p in params.items()}
        if FULL not in out:
            raise ConfigError("config field 'rope_parameters' is per layer type but has no 'full_attention'")
        return out
    if isinstance(params, Mapping) and params:
        flat = dict(params)
        if raw.get("partial_rotary_factor") is not None:
            flat.setdefault("partial_rotary_factor", raw["partial_rotary_factor"])
        return {FULL: _rope_params(flat, theta, "rope_parameters")}
    scaling = dict(raw.get("rope_scaling") or {})
    if raw.get("partial_rotary_factor") is not None:
        scaling.setdefault("partial_rotary_factor", raw["partial_rotary_factor"])
    out = {FULL: _rope_params(scaling, theta, "rope_scaling")}
    if raw.get("rope_local_base_freq") is not None:
        out[SLIDING] = RopeParams(theta=float(raw["rope_local_base_freq"]))
    return out
