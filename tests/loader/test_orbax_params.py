"""Orbax checkpoints written by `python -m jaxserve.convert`: `load_model` detects them and gives bitwise
the parameters and logits of the safetensors source; `--dtype` stores another dtype; a checkpoint that does
not fit the config is refused; a failed conversion leaves nothing behind; restoring places parameters
straight into a 2-device sharding."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from flax import nnx

from jaxserve.assets import EMBEDDED_MODEL_DIR
from jaxserve.convert import convert, main
from jaxserve.loader.errors import CorruptCheckpointError
from jaxserve.loader.load import load_model
from jaxserve.loader.orbax_params import is_orbax_checkpoint
from tests.models.helpers import Runner, full_logits, make_hf_checkpoint, random_ids

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

ROOT = Path(__file__).resolve().parents[2]


def flat_params(model) -> dict[str, np.ndarray]:
    return {"/".join(map(str, p)): np.asarray(v[...]) for p, v in nnx.to_flat_state(nnx.state(model))}


def assert_same_params(a, b) -> None:
    pa, pb = flat_params(a), flat_params(b)
    assert pa.keys() == pb.keys()
    for name in pa:
        assert pa[name].dtype == pb[name].dtype and np.array_equal(pa[name], pb[name]), name


@pytest.fixture(scope="module")
def embedded_orbax(tmp_path_factory) -> Path:
    return convert(EMBEDDED_MODEL_DIR, tmp_path_factory.mktemp("orbax") / "embedded")


def test_embedded_default_round_trips_bitwise_with_identical_logits(embedded_orbax: Path) -> None:
    assert is_orbax_checkpoint(embedded_orbax) and not is_orbax_checkpoint(EMBEDDED_MODEL_DIR)
    assert not list(embedded_orbax.glob("*.safetensors"))
    tokenizer = "tokenizer.json"
    assert (embedded_orbax / tokenizer).read_bytes() == (EMBEDDED_MODEL_DIR / tokenizer).read_bytes()
    source, converted = load_model(EMBEDDED_MODEL_DIR, progress=False), load_model(embedded_orbax)
    assert_same_params(source, converted)
    ids = random_ids(40, source.config.vocab_size, seed=1)
    assert np.array_equal(full_logits(Runner(source), ids)[0], full_logits(Runner(converted), ids)[0])


def test_dtype_flag_stores_that_dtype(tmp_path: Path) -> None:
    argv = ["--from", str(EMBEDDED_MODEL_DIR), "--to", str(tmp_path / "bf16"), "--dtype", "bfloat16"]
    assert main(argv) == 0
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    converted = load_model(tmp_path / "bf16")
    assert {a.dtype.name for a in flat_params(converted).values()} == {"bfloat16"}
    assert_same_params(load_model(EMBEDDED_MODEL_DIR, dtype="bfloat16", progress=False), converted)


def test_a_checkpoint_that_does_not_fit_the_config_is_refused(embedded_orbax: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "params").symlink_to(embedded_orbax / "params", target_is_directory=True)
    raw = json.loads((embedded_orbax / "config.json").read_text())
    raw["intermediate_size"] = raw["intermediate_size"] * 2
    (other / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CorruptCheckpointError, match="does not match"):
        load_model(other)


def test_conversion_refuses_an_existing_target_and_leaves_nothing_when_it_fails(tmp_path: Path,
                                                                               monkeypatch) -> None:
    (tmp_path / "taken").mkdir()
    with pytest.raises(FileExistsError):
        convert(EMBEDDED_MODEL_DIR, tmp_path / "taken")

    def fail_midway(model, directory: Path) -> None:
        (directory / "params").mkdir()
        raise OSError("disk full")

    monkeypatch.setattr("jaxserve.convert.save_params", fail_midway)
    with pytest.raises(OSError, match="disk full"):
        convert(EMBEDDED_MODEL_DIR, tmp_path / "out")
    assert [p.name for p in tmp_path.iterdir()] == ["taken"]  # no partial directory, no target


@pytest.mark.hf
def test_hf_llama_round_trips_with_identical_logits(tmp_path: Path) -> None:
    make_hf_checkpoint(tmp_path / "hf", "llama")
    converted = load_model(convert(tmp_path / "hf", tmp_path / "orbax"))
    source = load_model(tmp_path / "hf", progress=False)
    ids = random_ids(30, source.config.vocab_size, seed=0)
    assert np.array_equal(full_logits(Runner(source), ids)[0], full_logits(Runner(converted), ids)[0])


SHARDED = r"""
import os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
sys.path.insert(0, sys.argv[2])
import jax, numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
from jaxserve.loader.load import load_model
from tests.models.helpers import Runner, full_logits, random_ids


mesh = jax.make_mesh((2,), ("tp",), axis_types=(AxisType.Auto,))

def sharding_for(path, shape):  # split every matrix with an even last axis, replicate the rest
    return NamedSharding(mesh, P(None, "tp") if len(shape) == 2 and shape[-1] % 2 == 0 else P())

plain = load_model(sys.argv[1])
sharded = load_model(sys.argv[1], sharding_for=sharding_for)
kernel = sharded.layers[0].attn.q_proj.kernel[...]
assert kernel.sharding.spec == P(None, "tp") and len(kernel.sharding.device_set) == 2, kernel.sharding
ids = random_ids(30, plain.config.vocab_size, seed=0)
ref = full_logits(Runner(plain), ids)[0]
diff = np.abs(ref - full_logits(Runner(sharded), ids)[0]).max()
# The split matmuls add their two halves in another order: fp32 rounding of ~1e-6 of the logits' scale
# (which varies with the CPU's vector width); a misplaced shard moves logits by O(1).
assert diff < 1e-5 * max(1.0, float(np.abs(ref).max())), diff
print("OK", diff)
"""


def test_restore_places_parameters_straight_into_a_two_device_sharding(embedded_orbax: Path) -> None:
    result = subprocess.run([sys.executable, "-c", SHARDED, str(embedded_orbax), str(ROOT)],
                            capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-3000:]
