"""The server's persistent compilation cache: the default directory, and that a second process loads a small,
quick-to-compile CPU program from it instead of compiling it (JAX's default thresholds would keep such a
program out of the cache), as counted by `CompileLog`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxserve.server import compile_cache

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

ROOT = Path(__file__).resolve().parents[2]

_PROGRAM = """
import json, sys
from jaxserve.server import compile_cache
if sys.argv[1] == "off":
    compile_cache.disable_compilation_cache()
else:
    compile_cache.enable_compilation_cache(sys.argv[1])
log = compile_cache.CompileLog().install()
import jax, jax.numpy as jnp

before = (log.num_compiles, log.num_cache_hits)
jax.jit(lambda x: jnp.sin(x) * 3 + jnp.float32(0.25))(jnp.arange(7, dtype=jnp.float32)).block_until_ready()
print(json.dumps({"compiles": log.num_compiles - before[0], "hits": log.num_cache_hits - before[1]}))
"""


def _run(arg: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    out = subprocess.run([sys.executable, "-c", _PROGRAM, arg], cwd=ROOT,
                         env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_restarted_process_loads_small_programs_from_the_cache(tmp_path):
    cache = tmp_path / "jax"
    first = _run(str(cache))
    assert first["compiles"] >= 1 and first["hits"] == 0
    assert any(cache.iterdir())  # written although it compiled in far less than JAX's default 1 s
    second = _run(str(cache))
    assert second["compiles"] == 0 and second["hits"] == first["compiles"]
    off = _run("off")
    assert off["hits"] == 0 and off["compiles"] >= 1


def test_default_directory_is_the_user_cache_unless_jax_says_otherwise(monkeypatch, tmp_path):
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compile_cache.default_cache_dir() == tmp_path / "jaxserve" / "jax"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert compile_cache.default_cache_dir() == Path.home() / ".cache" / "jaxserve" / "jax"
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert compile_cache.default_cache_dir() == tmp_path / "elsewhere"
