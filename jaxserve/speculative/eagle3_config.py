"""EAGLE-3 draft configuration, parsed from the SpecForge/EAGLE `config.json` (Llama fields plus
`draft_vocab_size` and `eagle_config`), and the convention for which target layers are captured: ids mean
"output of target layer j" (see `jaxserve.speculative.eagle3_draft`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp

from jaxserve.layers.rotary import RopeParams
from jaxserve.models.config import ConfigError

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
_ROPE_FIELDS = {f.name for f in dataclasses.fields(RopeParams)} - {"rope_type", "theta"}


def default_aux_layer_ids(target_num_layers: int) -> tuple[int, ...]:
    """SpecForge's default capture (output-of-layer ids) for an L-layer target: `(1, L//2 - 1, L - 4)`."""
    return 1, target_num_layers // 2 - 1, target_num_layers - 4


@dataclasses.dataclass(frozen=True)
class Eagle3Config:
    """Draft hyper-parameters, parsed from an EAGLE-3 `config.json` (`from_dict`) or written by `to_dict`.

    `vocab_size` is the target's vocabulary (length of `t2d`); `draft_vocab_size` the LM head's rows (None
    in checkpoints without a draft vocabulary: then it equals `vocab_size` and there is no d2t/t2d).
    `target_hidden_size` is the width of one captured target hidden state (default `hidden_size`).
    """

    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    draft_vocab_size: int | None
    aux_layer_ids: tuple[int, ...]
    rope: RopeParams = dataclasses.field(default_factory=RopeParams)
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int | None = None
    target_hidden_size: int | None = None
    attention_bias: bool = False
    hidden_act: str = "silu"
    dtype: str = "float32"
    tie_word_embeddings: bool = False  # read by jaxserve.loader.load; EAGLE-3 heads are never tied
    raw: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False, hash=False)

    @property
    def jnp_dtype(self) -> jnp.dtype:
        return jnp.dtype(_DTYPES[self.dtype])

    @property
    def num_draft_tokens(self) -> int:
        return self.draft_vocab_size or self.vocab_size

    @property
    def fc_in_features(self) -> int:
        return len(self.aux_layer_ids) * (self.target_hidden_size or self.hidden_size)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], *, target_num_layers: int | None = None) -> Eagle3Config:
        """Parse SpecForge/EAGLE's config. `target_num_layers` is needed only when the config pins no
        `eagle_config.eagle_aux_hidden_state_layer_ids` (the default then depends on the target depth)."""
        raw = dict(raw)

        def need(name: str) -> Any:
            if raw.get(name) is None:
                raise ConfigError(f"EAGLE-3 draft config field {name!r} is missing")
            return raw[name]

        if int(raw.get("num_hidden_layers", 1)) != 1:
            raise ConfigError(f"EAGLE-3 draft config has num_hidden_layers={raw['num_hidden_layers']}; "
                              f"jaxserve supports the usual single midlayer only")
        eagle = raw.get("eagle_config") or {}
        if not eagle.get("use_aux_hidden_state", True):
            raise ConfigError("eagle_config.use_aux_hidden_state is false (an EAGLE-1/2 head); jaxserve's "
                              "draft needs EAGLE-3's captured target hidden states")
        ids = eagle.get("eagle_aux_hidden_state_layer_ids")
        if ids is None:
            if target_num_layers is None:
                raise ConfigError("EAGLE-3 draft config has no "
                                  "eagle_config.eagle_aux_hidden_state_layer_ids; pass target_num_layers for "
                                  "the default (1, L//2-1, L-4)")
            ids = default_aux_layer_ids(target_num_layers)
        ids = tuple(int(j) for j in ids)
        if target_num_layers is not None and not all(0 <= j < target_num_layers for j in ids):
            raise ConfigError(f"eagle_aux_hidden_state_layer_ids {list(ids)} (output-of-layer ids) are "
                              f"not all in [0, {target_num_layers}) for this target")
        hidden = int(need("hidden_size"))
        num_heads = int(need("num_attention_heads"))
        dtype = raw.get("dtype") or raw.get("torch_dtype") or "float32"
        if dtype not in _DTYPES:
            raise ConfigError(f"EAGLE-3 draft config dtype {dtype!r} is not supported; supported: "
                              f"{sorted(_DTYPES)}")
        draft_vocab = raw.get("draft_vocab_size")
        return cls(
            hidden_size=hidden, intermediate_size=int(need("intermediate_size")), num_heads=num_heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
            head_dim=int(raw.get("head_dim") or hidden // num_heads), vocab_size=int(need("vocab_size")),
            draft_vocab_size=None if draft_vocab is None else int(draft_vocab), aux_layer_ids=ids,
            rope=_rope(raw), rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=raw.get("max_position_embeddings"),
            target_hidden_size=raw.get("target_hidden_size"),
            attention_bias=bool(raw.get("attention_bias", False)), hidden_act=raw.get("hidden_act", "silu"),
            dtype=dtype, raw=raw)

    def to_dict(self) -> dict:
        """A SpecForge-style `config.json` dict (architectures `LlamaForCausalLMEagle3`)."""
        rope = {k: v for k, v in dataclasses.asdict(self.rope).items()
                if k in _ROPE_FIELDS and v is not None and k not in ("truncate", "partial_rotary_factor")}
        out = {
            "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
            "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_heads, "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim, "vocab_size": self.vocab_size, "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings, "hidden_act": self.hidden_act,
            "attention_bias": self.attention_bias, "tie_word_embeddings": False, "torch_dtype": self.dtype,
            "rope_theta": self.rope.theta,
            "rope_scaling": None if self.rope.rope_type == "default" else {"rope_type": self.rope.rope_type,
                                                                            **rope},
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids),
                             "use_aux_hidden_state": True},
        }
        if self.draft_vocab_size is not None:
            out["draft_vocab_size"] = self.draft_vocab_size
        if self.target_hidden_size is not None:
            out["target_hidden_size"] = self.target_hidden_size
        return out


def _rope(raw: Mapping[str, Any]) -> RopeParams:
    scaling = dict(raw.get("rope_scaling") or {})
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    kwargs = {k: scaling[k] for k in _ROPE_FIELDS if scaling.get(k) is not None}
    try:
        return RopeParams(rope_type=kind, theta=float(raw.get("rope_theta") or 10000.0), **kwargs)
    except ValueError as e:
        raise ConfigError(f"EAGLE-3 draft config field 'rope_scaling': {e}") from None
