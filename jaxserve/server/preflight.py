"""Start-up checks of the files a server is about to load, so that a broken file is refused with one message
naming it (instead of a traceback, or an error at the first request).

`check_launch_files(model_path, tokenizer_path, draft_path)` parses the target's config.json, opens its
tokenizer.json (when there is one) and, for speculative decoding, reads the EAGLE-3 head's config and checks
that it was made for this target: same vocabulary, and captured hidden states as wide as the target's.
Weights themselves are checked by the loader (every tensor's header, dtype and size), which the launcher
reports the same way.
"""

from __future__ import annotations

from pathlib import Path


class PreflightError(ValueError):
    """A file the server needs is missing, corrupt or does not fit the others; the message names it."""


def check_launch_files(model_path: str, tokenizer_path: str | None = None,
                       draft_path: str | None = None) -> None:
    """Raise PreflightError naming the first broken or mismatched file; return None when all parse."""
    from jaxserve.models.config import ModelConfig

    try:
        target = ModelConfig.from_file(model_path)
    except ValueError as exc:
        raise PreflightError(f"target model config: {exc}") from None
    tokenizer_file = Path(tokenizer_path or model_path) / "tokenizer.json"
    if tokenizer_file.exists():
        _check_tokenizer(tokenizer_file)
    elif tokenizer_path is not None:
        raise PreflightError(f"--tokenizer-path {tokenizer_path}: no tokenizer.json there")
    if draft_path is not None:
        _check_draft(Path(draft_path), target)


def _check_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer

    try:
        Tokenizer.from_file(str(path))
    except Exception as exc:  # the tokenizers library raises a bare Exception for any parse failure
        raise PreflightError(f"{path} is not a valid tokenizer file ({exc}); restore it from the "
                             f"checkpoint or pass --tokenizer-path DIR") from None


def _check_draft(directory: Path, target) -> None:
    from jaxserve.speculative.eagle3_checkpoint import read_eagle3_config

    try:
        draft = read_eagle3_config(directory, target_num_layers=target.num_layers)
    except ValueError as exc:
        raise PreflightError(f"EAGLE-3 draft at {directory}: {exc}") from None
    width = draft.target_hidden_size or draft.hidden_size
    if width != target.hidden_size:
        raise PreflightError(f"EAGLE-3 draft at {directory} reads target hidden states of width {width}, but "
                             f"the target has hidden_size {target.hidden_size}: use the draft trained for "
                             f"this target")
    if draft.vocab_size != target.vocab_size:
        raise PreflightError(f"EAGLE-3 draft at {directory} has vocab_size {draft.vocab_size}, the target "
                             f"{target.vocab_size}: use the draft trained for this target")
