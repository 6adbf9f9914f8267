"""Package data. `EMBEDDED_MODEL_DIR`: the tiny gpt-oss target served when no `--model-path` is given
(config.json, model.safetensors, tokenizer.json, tokenizer_config.json), with its EAGLE-3 head in
`EMBEDDED_DRAFT_DIR`. Rebuilt by `python -m jaxserve.training.build_embedded` (see `jaxserve.training`)."""

from pathlib import Path

EMBEDDED_MODEL_DIR = Path(__file__).resolve().parent / "embedded"
EMBEDDED_DRAFT_DIR = EMBEDDED_MODEL_DIR / "draft"


def embedded_model_available() -> bool:
    return (EMBEDDED_MODEL_DIR / "model.safetensors").exists()
