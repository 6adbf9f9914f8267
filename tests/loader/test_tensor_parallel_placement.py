"""Parameters placed with a 2-device tensor-parallel NamedSharding give the same logits (the TP hook).

Runs in a subprocess: the 2 virtual CPU devices must be configured before JAX starts."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.hf, pytest.mark.slow]


SCRIPT = r"""
import os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
sys.path.insert(0, sys.argv[2])
import jax, numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
from jaxserve.loader.load import load_model
from tests.models.helpers import Runner, full_logits, make_hf_checkpoint, random_ids

path = sys.argv[1]
make_hf_checkpoint(path, "qwen2")
mesh = jax.make_mesh((2,), ("tp",), axis_types=(AxisType.Auto,))
COLUMN, ROW = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"), ("o_proj", "down_proj")

def sharding_for(param_path, shape):
    owner = param_path[-2] if len(param_path) > 1 else ""
    if owner in COLUMN:  # kernel [in, out] and bias [out] split on the output features
        return NamedSharding(mesh, P(None, "tp") if param_path[-1] == "kernel" else P("tp"))
    if owner in ROW and param_path[-1] == "kernel":
        return NamedSharding(mesh, P("tp", None))
    return NamedSharding(mesh, P())

plain = load_model(path, progress=False)
sharded = load_model(path, progress=False, sharding_for=sharding_for)
kernel = sharded.layers[0].attn.q_proj.kernel[...]
assert kernel.sharding.spec == P(None, "tp") and len(kernel.sharding.device_set) == 2
ids = random_ids(30, 256, seed=0)
diff = np.abs(full_logits(Runner(plain), ids)[0] - full_logits(Runner(sharded), ids)[0]).max()
assert diff < 1e-5, diff
print("OK", diff)
"""


def test_tensor_parallel_sharded_parameters_give_the_same_logits(tmp_path):
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "ckpt"), str(root)],
                            capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-3000:]
