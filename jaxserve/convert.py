"""`python -m jaxserve.convert --from HF_DIR --to ORBAX_DIR [--dtype bfloat16]`: a Hugging Face checkpoint
directory -> an orbax checkpoint of jaxserve's parameters (layout: `jaxserve.loader.orbax_params`).

The source is read by the same loader that serves it (weight transforms, fused projections, MXFP4
dequantization all run once, here), so the result is exactly what `--model-path HF_DIR` would serve, and
`--model-path ORBAX_DIR` (detected) serves it again without the per-tensor work. config.json is rewritten
with the stored dtype; tokenizer and generation files are copied. The output appears atomically: it is
written under a temporary name beside `--to` and renamed when complete.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from jaxserve.loader.load import load_model
from jaxserve.loader.orbax_params import save_params

# Checkpoint files the orbax directory replaces; everything else at the top level (tokenizer, generation
# config, chat template, README) is copied.
_WEIGHT_SUFFIXES = (".safetensors", ".safetensors.index.json", ".bin", ".pt", ".pth")


def convert(source: str | Path, target: str | Path, *, dtype: str | None = None) -> Path:
    """Write the orbax form of the checkpoint at `source` to `target` (which must not exist); returns it.
    `dtype`: the stored parameter dtype (default: the checkpoint's)."""
    source, target = Path(source), Path(target)
    if target.exists():
        raise FileExistsError(f"{target} exists; choose a new --to directory")
    model = load_model(source, dtype=dtype, progress=False)
    partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        for item in source.iterdir():
            if item.is_file() and item.name != "config.json" and not item.name.endswith(_WEIGHT_SUFFIXES):
                shutil.copy2(item, partial / item.name)
        raw = json.loads((source / "config.json").read_text())
        raw["dtype"] = model.config.dtype
        if "torch_dtype" in raw:
            raw["torch_dtype"] = model.config.dtype
        (partial / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
        save_params(model, partial)
        partial.rename(target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxserve.convert", description=__doc__.split("\n\n")[0])
    parser.add_argument("--from", dest="source", required=True, help="Hugging Face checkpoint directory")
    parser.add_argument("--to", dest="target", required=True, help="new directory for the orbax checkpoint")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                        help="stored parameter dtype (default: the checkpoint's)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    out = convert(args.source, args.target, dtype=args.dtype)
    print(f"wrote {out} in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
