"""Loading keeps no second copy of the checkpoint: peak resident memory grows by about the parameters plus
a few tensors, not twice the checkpoint (file pages of loaded tensors are dropped as loading proceeds).

Runs in a fresh subprocess so that the peak (VmHWM) belongs to the load alone. Linux only (/proc)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import save_file

from jaxserve.models.build import abstract_model
from jaxserve.models.config import ModelConfig
from jaxserve.models.weight_spec import transpose

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

CONFIG = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=4000, hidden_size=512,
              intermediate_size=1024, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
              rope_theta=10000.0)

SCRIPT = r"""
import sys
sys.path.insert(0, sys.argv[2])
import jax
from jaxserve.loader.load import load_model


def status(key):
    line = next(l for l in open("/proc/self/status") if l.startswith(key + ":"))
    return int(line.split()[1]) * 1024

jax.numpy.zeros(1).block_until_ready()
before = status("VmRSS")
model = load_model(sys.argv[1], progress=False)
print(status("VmHWM") - before)
"""


def _write_checkpoint(directory: Path) -> tuple[int, int]:
    """Random float32 tensors under HF names; returns (file bytes, largest tensor bytes)."""
    model = abstract_model(ModelConfig.from_dict(CONFIG))
    flat = nnx.to_flat_state(nnx.state(model))
    shapes = {path: tuple(v.shape) for path, v in zip(flat.paths, flat.leaves, strict=True)}
    rng = np.random.default_rng(0)
    tensors = {}
    for spec in model.weight_specs():
        shape = shapes[spec.target][::-1] if spec.transform is transpose else shapes[spec.target]
        tensors[spec.sources[0]] = rng.standard_normal(shape, dtype=np.float32)
    directory.mkdir()
    save_file(tensors, directory / "model.safetensors")
    (directory / "config.json").write_text(json.dumps(CONFIG))
    return (directory / "model.safetensors").stat().st_size, max(t.nbytes for t in tensors.values())


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_peak_memory_is_parameters_plus_a_few_tensors(tmp_path):
    size, largest = _write_checkpoint(tmp_path / "ckpt")
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "ckpt"), str(root)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    peak_growth = int(result.stdout.split()[-1])
    # a second full copy (e.g. every file page kept resident next to the parameters) would be ~2 * size
    assert peak_growth < size + 3 * largest + 25 * 2**20, (peak_growth / 2**20, size / 2**20)
