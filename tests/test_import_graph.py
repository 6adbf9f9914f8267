"""Imports run one way:
cache <- memory <- layers <- models <- loader <- engine <- speculative <- api <- server,
with the entry points (benchmarks, training, CLIs) on top. Every import statement is read with `ast`,
including imports inside functions, so a lazy import cannot hide an upward edge."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# rank of each package (or top-level module) of jaxserve; a module may import its own rank or lower ones.
# `sampling` and `assets` depend on nothing else of jaxserve and sit beside `layers`.
RANKS = {
    "memory": 1, "layers": 2, "sampling": 2, "assets": 2, "models": 3, "loader": 4, "engine": 5,
    "speculative": 6, "api": 7, "server": 8,
    "bench": 9, "training": 9, "test": 9, "bench_serving": 9, "launch_server": 9, "cache_demo": 9,
    "__main__": 9, "convert": 9,
}

# what `jaxserve/__init__.py` exports lazily, by the module that defines it
TOP_LEVEL = {"Engine": "api", "ServerArgs": "engine"}


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, dotted module) of every import in the file, nested ones included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "jaxserve":  # `from jaxserve import engine` names the package itself
                out += [(node.lineno, f"jaxserve.{TOP_LEVEL.get(alias.name, alias.name)}")
                        for alias in node.names]
            else:
                out.append((node.lineno, node.module))
    return out


def _unit(module: str) -> str | None:
    """The jaxserve package a dotted name belongs to (None for `jaxserve` itself or outside jaxserve)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "jaxserve" and len(parts) > 1 else None


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _upward_edges(files: list[Path], own_rank: int) -> list[str]:
    bad = []
    for path in files:
        for line, module in _imported_modules(path):
            unit = _unit(module)
            if unit is not None and RANKS.get(unit, 99) > own_rank:
                bad.append(f"{_name(path)}:{line} imports {module}")
    return bad


def test_every_jaxserve_package_has_a_rank():
    units = {p.stem if p.is_file() else p.name for p in (ROOT / "jaxserve").iterdir()
             if (p.is_file() and p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
    assert units <= set(RANKS), f"give {sorted(units - set(RANKS))} a rank in RANKS"


@pytest.mark.parametrize("unit", sorted(RANKS))
def test_no_package_imports_one_above_it(unit):
    pkg = ROOT / "jaxserve" / unit
    files = sorted(pkg.rglob("*.py")) if pkg.is_dir() else [ROOT / "jaxserve" / f"{unit}.py"]
    assert _upward_edges(files, RANKS[unit]) == []


def test_cache_imports_nothing_from_jaxserve():
    bad = [f"{p.relative_to(ROOT)}:{line} imports {m}" for p in sorted((ROOT / "cache").rglob("*.py"))
           for line, m in _imported_modules(p) if m == "jaxserve" or m.startswith("jaxserve.")]
    assert bad == []


def test_the_checker_sees_an_upward_import(tmp_path):
    """A lazy import inside a function and `from jaxserve import api` are edges; a lower package is fine."""
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from jaxserve.speculative.worker import X\n"
                   "from jaxserve import api\nimport jaxserve.memory\n")
    assert sorted((line, _unit(m)) for line, m in _imported_modules(src)) == [
        (2, "speculative"), (3, "api"), (4, "memory")]
    assert sorted(e.split(" imports ")[1] for e in _upward_edges([src], RANKS["engine"])) == [
        "jaxserve.api", "jaxserve.speculative.worker"]
