"""EAGLE-3 speculative decoding with tensor parallelism (`Engine(tp_size=..., speculative_algorithm=...)`) on
8 fake CPU devices, in one subprocess for all targets (the device count must be set before JAX starts):
see tests/speculative/tp_spec_check.py for what is checked - greedy chain and tree outputs at tp 2, 4 and 8
equal the tp 1 plain engine's on tiny Llama, Qwen3 and gpt-oss (kv heads replicated past 2), the draft
replicated, each program compiled once."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.hf, pytest.mark.slow]

SCRIPT = Path(__file__).with_name("tp_spec_check.py")


def test_speculative_greedy_outputs_under_tensor_parallelism_equal_tp1_plain(tmp_path):
    # no persistent compilation cache in the child (as test_tensor_parallel: a cache write has aborted
    # processes on this CPU build)
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    result = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "llama", "qwen3", "gpt_oss"],
                            capture_output=True, text=True, timeout=900, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    runs = [("llama", "chain", 4), ("llama", "tree", 8), ("qwen3", "chain", 2), ("gpt_oss", "tree", 4),
            ("gpt_oss", "chain", 8)]
    assert [f"OK {a} {d} tp={tp} " in result.stdout for a, d, tp in runs] == [True] * len(runs), result.stdout
