"""The built wheel is a working package: installed with `--no-deps` into a throwaway venv that holds only the
runtime requirements (and what they depend on), its console scripts run and `Engine().generate` on the
embedded default gives the source tree's tokens, from a directory outside the source tree.

Offline by construction: the wheel is built with the project venv's setuptools (`--no-build-isolation`), and
the throwaway venv's site-packages links the runtime distributions already installed in the project venv,
chosen by walking `requirements.txt`'s requirement graph (extras not requested are not followed)."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

ROOT = Path(__file__).resolve().parents[2]
PROMPT, NUM_TOKENS = "The os module provides", 8
GENERATE = f"""
import importlib.util, json, jaxserve
from jaxserve import Engine

out = Engine().generate({PROMPT!r}, {{"max_new_tokens": {NUM_TOKENS}, "temperature": 0}})
leaked = [m for m in ("torch", "transformers", "pytest") if importlib.util.find_spec(m)]
print(json.dumps({{"file": jaxserve.__file__, "ids": out["output_ids"], "leaked": leaked}}))
"""


def pins(path: Path) -> dict[str, str]:
    """`name -> version` of a requirements file's `name==version` lines (comments and `-r` lines skipped)."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line and not line.startswith("-"):
            req = Requirement(line)
            out[canonicalize_name(req.name)] = str(req.specifier).removeprefix("==")
    return out


def declared(requirements: list[str]) -> dict[str, Requirement]:
    return {canonicalize_name(r.name): r for r in map(Requirement, requirements) if r.name != "jaxserve"}


def test_pyproject_ranges_admit_exactly_the_pinned_requirements() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime, dev = pins(ROOT / "requirements.txt"), pins(ROOT / "requirements-dev.txt")
    deps = declared(project["dependencies"])
    extras = project["optional-dependencies"]
    test_deps = declared(extras["test"] + extras["notebooks"])
    assert set(deps) == set(runtime), "pyproject dependencies and requirements.txt name different packages"
    assert set(test_deps) == set(dev), "the [test] extra and requirements-dev.txt name different packages"
    for name, req in [*deps.items(), *test_deps.items()]:
        version = runtime.get(name) or dev[name]
        assert req.specifier.contains(version), f"{name}=={version} is outside pyproject's {req.specifier}"
    assert "jaxserve[notebooks]" in extras["test"]
    assert {"tpu", "cuda12"} <= set(extras)
    assert project["scripts"] == {"jaxserve-server": "jaxserve.server.launch:main",
                                  "jaxserve-bench-serving": "jaxserve.bench_serving:main"}


def runtime_closure(requirements: Path) -> list[md.Distribution]:
    """The installed distributions `requirements` names, and recursively their requirements (markers
    evaluated for this interpreter, without extras)."""
    todo = [Requirement(line.split("#")[0].strip()) for line in requirements.read_text().splitlines()
            if line.split("#")[0].strip()]
    seen: dict[str, md.Distribution] = {}
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        seen[name] = dist = md.distribution(req.name)
        todo.extend(Requirement(r) for r in dist.requires or ())
    return list(seen.values())


def link_site_packages(dists: list[md.Distribution], site: Path) -> None:
    """Symlink each distribution's top-level files and folders (packages, extension modules, dist-info) into
    `site`. A namespace folder shared with a distribution outside the set comes along whole."""
    src_site = Path(sysconfig.get_paths()["purelib"])
    for dist in dists:
        for file in dist.files or ():
            top = file.parts[0]
            if top in ("..", "__pycache__") or top.endswith(".pth"):
                continue
            target = site / top
            if not target.exists() and not target.is_symlink():
                target.symlink_to(src_site / top)


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"  # a copy, so the build's egg-info and build/ never land in the clone
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for package in ("jaxserve", "cache"):
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp / "dist"), str(src)], check=True)
    (wheel,) = (tmp / "dist").glob("jaxserve-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = venv.glob("lib/python*/site-packages")
    link_site_packages(runtime_closure(ROOT / "requirements.txt"), site)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-deps", "--no-index", str(wheel)], check=True)
    return venv


def isolated_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["JAX_PLATFORMS"] = "cpu"
    return env


def test_runtime_closure_follows_requirements_not_test_tools() -> None:
    names = {canonicalize_name(d.metadata["Name"]) for d in runtime_closure(ROOT / "requirements.txt")}
    assert {"jax", "flax", "orbax-checkpoint", "fastapi", "starlette", "numpy"} <= names
    assert not names & {"torch", "pytest", "transformers", "jaxserve"}


@pytest.mark.slow
def test_console_script_prints_the_launch_flags(wheel_venv: Path, tmp_path: Path) -> None:
    out = subprocess.run([str(wheel_venv / "bin" / "jaxserve-server"), "--help"], cwd=tmp_path,
                         env=isolated_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--model-path" in out.stdout and "--speculative-algorithm" in out.stdout
    bench = subprocess.run([str(wheel_venv / "bin" / "jaxserve-bench-serving"), "--help"], cwd=tmp_path,
                           env=isolated_env(), capture_output=True, text=True, timeout=120)
    assert bench.returncode == 0 and "--num-prompts" in bench.stdout, bench.stderr


@pytest.mark.slow
def test_installed_engine_generates_the_source_trees_tokens(wheel_venv: Path, tmp_path: Path) -> None:
    out = subprocess.run([str(wheel_venv / "bin" / "python"), "-c", GENERATE], cwd=tmp_path,
                         env=isolated_env(), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert Path(got["file"]).is_relative_to(wheel_venv), got["file"]  # the wheel's copy, not the clone
    assert got["leaked"] == []  # only the runtime requirements are importable there

    from jaxserve import Engine

    expected = Engine().generate(PROMPT, {"max_new_tokens": NUM_TOKENS, "temperature": 0})["output_ids"]
    assert got["ids"] == expected and len(expected) == NUM_TOKENS
