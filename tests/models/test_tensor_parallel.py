"""Tensor parallelism (`jaxserve.models.sharding`, `Engine(tp_size=...)`) on 8 fake CPU devices, in a
subprocess (the device count must be set before JAX starts): see tests/models/tp_check.py for what is
checked - greedy outputs at tp 2/4 equal the unsharded model's (scanned and unrolled, and through the
engine with the radix cache on), per-device bytes of weights and KV pools, no collective on a pool shard;
gpt-oss also at tp 4 with ep 1 and 2 (MoE all-reduces of [tokens, hidden] only)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.hf, pytest.mark.slow]

SCRIPT = Path(__file__).with_name("tp_check.py")


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gpt_oss"])
def test_tensor_parallel_greedy_outputs_and_per_device_bytes(arch, tmp_path):
    # no persistent compilation cache in the child: a cache write (executable.serialize) has aborted
    # processes on this CPU build (see jaxserve.layers.backends), and nothing here needs it
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    result = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), arch], capture_output=True,
                            text=True, timeout=900, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    assert [f"OK {arch} tp={tp}" in result.stdout for tp in (2, 4)] == [True] * 2, result.stdout
