"""Write models as Hugging Face checkpoints (config.json + model.safetensors) and assemble the embedded one.

`save_hf_checkpoint` inverts the model's own `weight_specs()` (the loader's name and layout table), so what
it writes is exactly what `jaxserve.loader.load.load_model` reads back, under HF transformers' tensor names.

    python -m jaxserve.training.export --target build/embedded/target --tokenizer build/embedded/tokenizer \
        --draft build/embedded/draft --out jaxserve/assets/embedded

copies the trained target, tokenizer and EAGLE-3 head into the package-data directory
(`draft/` inside it) and checks the total stays under the 20 MB budget.
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from jaxserve.assets import EMBEDDED_MODEL_DIR
from jaxserve.models.weight_spec import identity, transpose

SIZE_BUDGET_BYTES = 20 * 1024 * 1024
EMBEDDED_DIR = EMBEDDED_MODEL_DIR


def checkpoint_tensors(model) -> dict[str, np.ndarray]:
    """`{hf_name: array}` for a model with `weight_specs()` whose specs are one-source copies or
    transposes (every dense jaxserve model; not MXFP4 sources)."""
    flat = nnx.to_flat_state(nnx.state(model))
    params = {path: np.asarray(var[...]) for path, var in zip(flat.paths, flat.leaves, strict=True)}
    out = {}
    for spec in model.weight_specs():
        if len(spec.sources) != 1 or spec.transform not in (identity, transpose):
            raise ValueError(f"cannot invert the weight spec of {spec.target} (sources {spec.sources})")
        value = params[spec.target]
        out[spec.sources[0]] = np.ascontiguousarray(value.T if spec.transform is transpose else value)
    return out


def save_hf_checkpoint(model, directory: str | Path, config: Mapping) -> Path:
    """Write `config.json` (`config` as given) and `model.safetensors` into `directory`; returns it."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(dict(config), indent=1))
    save_file(checkpoint_tensors(model), str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


_README = """# jaxserve embedded default model

A tiny gpt-oss-architecture target (`GptOssForCausalLM`: 4 layers alternating sliding-window 32 / full
attention, sinks, 4-expert top-2 MoE, YaRN rotary, byte-level BPE vocab 1024) trained on the Python
standard library's docstrings and the English prose of installed package descriptions and license texts
(documents packed so that an end of text follows a few thousand characters, not every short paragraph),
and its EAGLE-3 head in `draft/` (SpecForge layout; captures the outputs of target layers 0, 1, 2).
Served when no `--model-path` is given. Not a useful language model: a fixture that runs on a laptop CPU
and exercises every code path of the real gpt-oss + EAGLE-3 pair.

Losses and throughput of the run that produced these files: `training.json`, `draft/training.json`.
Retrain (offline, about 30 minutes on 2 CPU cores): `python -m jaxserve.training.build_embedded`.
"""


def directory_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in Path(directory).rglob("*") if p.is_file())


def assemble(target: Path, tokenizer: Path, draft: Path | None, out: Path) -> int:
    """Copy the pieces into `out` (replacing it); returns its size in bytes (ValueError over budget)."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copy(target / name, out / name)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer / name, out / name)
    if draft is not None:
        (out / "draft").mkdir()
        for name in ("config.json", "model.safetensors"):
            shutil.copy(draft / name, out / "draft" / name)
    for extra in ("training.json",):
        for src, dst in ((target, out), (draft, out / "draft")):
            if src is not None and (src / extra).exists():
                shutil.copy(src / extra, dst / extra)
    (out / "README.md").write_text(_README)
    size = directory_bytes(out)
    if size > SIZE_BUDGET_BYTES:
        raise ValueError(f"{out} holds {size / 2**20:.1f} MiB, over the {SIZE_BUDGET_BYTES / 2**20:.0f} MiB "
                         f"package-data budget")
    return size


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="build/embedded/target")
    parser.add_argument("--tokenizer", default="build/embedded/tokenizer")
    parser.add_argument("--draft", default="build/embedded/draft", help="'' to ship no draft")
    parser.add_argument("--out", default=str(EMBEDDED_DIR))
    args = parser.parse_args(argv)
    size = assemble(Path(args.target), Path(args.tokenizer), Path(args.draft) if args.draft else None,
                    Path(args.out))
    print(json.dumps({"out": args.out, "bytes": size}))


if __name__ == "__main__":
    main()
