"""What the engine needs for `speculative_algorithm="EAGLE3"`: the draft head."""

from __future__ import annotations

from pathlib import Path

from jaxserve.engine.config import ServerArgs
from jaxserve.engine.errors import InvalidRequestError


def load_draft(args: ServerArgs):
    """The EAGLE-3 head at `args.speculative_draft_model_path` (SpecForge layout). A config without
    `eagle_aux_hidden_state_layer_ids` takes SpecForge's default for the target's depth."""
    from jaxserve.models.config import ModelConfig
    from jaxserve.speculative.eagle3_checkpoint import load_eagle3_draft

    if args.speculative_draft_model_path is None:
        raise InvalidRequestError("speculative_algorithm is set but speculative_draft_model_path is not")
    num_layers = None
    if args.model_path is not None and (Path(args.model_path) / "config.json").exists():
        num_layers = ModelConfig.from_file(args.model_path).num_layers
    return load_eagle3_draft(args.speculative_draft_model_path, target_num_layers=num_layers,
                             backend=args.attention_backend)
