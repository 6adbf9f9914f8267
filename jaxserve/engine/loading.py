"""What the engine takes from a checkpoint directory: the model, the tokenizer (optional) and EOS ids."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jax.sharding import Mesh

from jaxserve.engine.config import ServerArgs
from jaxserve.engine.errors import InvalidRequestError
from jaxserve.models.config import ModelConfig
from jaxserve.models.decoder import CausalLM
from jaxserve.models.sharding import set_mesh, sharding_for


def load_model_and_tokenizer(args: ServerArgs, *, aux_hidden_state_layer_ids=(),
                             mesh: Mesh | None = None) -> tuple[CausalLM, Any]:
    """`args.model_path`'s model (None: the embedded default) in `args.dtype` ("auto" = the checkpoint's) and
    its `HFTokenizer`, or None when the directory has no tokenizer.json or `skip_tokenizer_init` is set.
    `aux_hidden_state_layer_ids`: the layers an EAGLE-3 draft reads (see `jaxserve.models.decoder`).
    `mesh`: tensor parallelism - each parameter is placed sharded as it loads (`models.sharding`, experts
    as `args.ep_size` says)."""
    from jaxserve.loader.load import load_model
    from jaxserve.loader.tokenizer import HFTokenizer

    model_path = args.model_path
    if model_path is None:
        from jaxserve.assets import EMBEDDED_MODEL_DIR, embedded_model_available

        if not embedded_model_available():
            raise InvalidRequestError("Engine needs model_path= (a checkpoint directory) or model= (this "
                                      "install has no embedded default model)")
        model_path = str(EMBEDDED_MODEL_DIR)
    place = None
    if mesh is not None:
        place = sharding_for(ModelConfig.from_file(model_path), mesh, args.ep_size)
    model = load_model(model_path, dtype=None if args.dtype == "auto" else args.dtype,
                       backend=args.attention_backend, aux_hidden_state_layer_ids=aux_hidden_state_layer_ids,
                       sharding_for=place)
    if mesh is not None:
        set_mesh(model, mesh)
    has_tokenizer = (Path(model_path) / "tokenizer.json").exists() and not args.skip_tokenizer_init
    return model, HFTokenizer(model_path) if has_tokenizer else None


def eos_token_ids(raw_config: Mapping[str, Any], tokenizer) -> list[int]:
    """The tokenizer's EOS ids merged with config.json's `eos_token_id` (an int or a list)."""
    ids = set(tokenizer.eos_token_ids) if tokenizer is not None else set()
    eos = raw_config.get("eos_token_id")
    ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    return sorted(int(i) for i in ids)
