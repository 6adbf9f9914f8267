"""A server refuses broken files at start with one clear message naming the file: corrupt weights, a corrupt
tokenizer, a broken config, an EAGLE-3 draft made for another target. `preflight` in-process for each case;
one launch_server process shows the whole refusal (exit 1, one `error:` line, no traceback)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jaxserve.server.preflight import PreflightError, check_launch_files
from tests.server.checkpoint import write_spec_pair, write_tiny_checkpoint

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def spec_pair(tmp_path_factory) -> tuple[Path, Path]:
    return write_spec_pair(tmp_path_factory.mktemp("pair"))


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_intact_files_pass(tiny, spec_pair):
    check_launch_files(str(tiny))
    check_launch_files(str(spec_pair[0]), draft_path=str(spec_pair[1]))


@pytest.mark.parametrize("content", ["{not json", '{"version": "1.0", "model": {"type": "nonsense"}}', ""])
def test_a_corrupt_tokenizer_is_named(tiny, tmp_path, content):
    broken = _copy(tiny, tmp_path / "m")
    (broken / "tokenizer.json").write_text(content)
    with pytest.raises(PreflightError, match=r"tokenizer.json is not a valid tokenizer file"):
        check_launch_files(str(broken))


def test_a_broken_config_is_named(tiny, tmp_path):
    broken = _copy(tiny, tmp_path / "m")
    (broken / "config.json").write_text("{broken")
    with pytest.raises(PreflightError, match=r"config.json is not valid JSON"):
        check_launch_files(str(broken))


@pytest.mark.parametrize("field,value,needle", [("target_hidden_size", 3 * 64, "reads target hidden states"),
                                                ("vocab_size", 7, "vocab_size 7")])
def test_a_draft_for_another_target_is_refused(spec_pair, tmp_path, field, value, needle):
    target, draft = spec_pair
    other = _copy(draft, tmp_path / "draft")
    config = json.loads((other / "config.json").read_text())
    if field == "target_hidden_size":
        value = 3 * json.loads((target / "config.json").read_text())["hidden_size"]
    config[field] = value
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(PreflightError, match=needle):
        check_launch_files(str(target), draft_path=str(other))


def _launch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jaxserve.launch_server", *args, "--port", "0",
                           "--disable-compilation-cache"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_launch_refuses_a_corrupt_tokenizer_and_truncated_weights_with_one_line(tiny, tmp_path):
    bad_tokenizer = _copy(tiny, tmp_path / "tok")
    (bad_tokenizer / "tokenizer.json").write_text("{not json")
    bad_weights = _copy(tiny, tmp_path / "weights")
    for f in bad_weights.glob("*.safetensors"):
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    for directory, needle in ((bad_tokenizer, "tokenizer.json is not a valid tokenizer file"),
                              (bad_weights, "model.safetensors")):
        out = _launch("--model-path", str(directory))
        errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
        assert out.returncode == 1, out.stderr
        assert len(errors) == 1 and needle in errors[0], out.stderr
        assert "Traceback" not in out.stderr


def test_an_engine_that_cannot_run_a_first_request_is_refused_with_one_line(monkeypatch, capsys):
    from jaxserve.server import launch, server_log, warmup

    def fail(engine, vocab_size):
        raise RuntimeError("dot_general shapes (4, 96) and (64, 64) do not fit")

    monkeypatch.setattr(server_log, "configure_logging", lambda level: None)
    monkeypatch.setattr(launch, "setup_compilation_cache", lambda args: "compilation cache: (test)")
    monkeypatch.setattr(launch, "build_engine", lambda args: type("E", (), {"vocab_size": 10})())
    monkeypatch.setattr(warmup, "prime", fail)
    assert launch.main(["--port", "0"]) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert errors == ["error: the engine could not run a first request: RuntimeError: dot_general shapes "
                      "(4, 96) and (64, 64) do not fit"]
