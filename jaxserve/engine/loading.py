"""What the engine takes from a checkpoint directory: the model, the tokenizer (optional) and EOS ids."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jaxserve.engine.config import ServerArgs
from jaxserve.engine.errors import InvalidRequestError
from jaxserve.models.decoder import CausalLM


def load_model_and_tokenizer(args: ServerArgs, *, aux_hidden_state_layer_ids=()) -> tuple[CausalLM, Any]:
    """`args.model_path`'s model (in `args.dtype`, "auto" = the checkpoint's) and its `HFTokenizer`, or None
    when the directory has no tokenizer.json or `skip_tokenizer_init` is set. `aux_hidden_state_layer_ids`:
    the layers an EAGLE-3 draft reads (see `jaxserve.models.decoder`)."""
    from jaxserve.loader.load import load_model
    from jaxserve.loader.tokenizer import HFTokenizer

    if args.model_path is None:
        raise InvalidRequestError("Engine needs model_path= (a checkpoint directory) or model=")
    model = load_model(args.model_path, dtype=None if args.dtype == "auto" else args.dtype,
                       backend=args.attention_backend, aux_hidden_state_layer_ids=aux_hidden_state_layer_ids)
    has_tokenizer = (Path(args.model_path) / "tokenizer.json").exists() and not args.skip_tokenizer_init
    return model, HFTokenizer(args.model_path) if has_tokenizer else None


def eos_token_ids(raw_config: Mapping[str, Any], tokenizer) -> list[int]:
    """The tokenizer's EOS ids merged with config.json's `eos_token_id` (an int or a list)."""
    ids = set(tokenizer.eos_token_ids) if tokenizer is not None else set()
    eos = raw_config.get("eos_token_id")
    ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    return sorted(int(i) for i in ids)
