"""Every notebook in notebooks/ runs top to bottom: code cells are executed in order in one namespace (no
Jupyter kernel needed), so a notebook that goes stale against the API fails CI."""

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ should hold at least one notebook"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path: Path, capsys):
    notebook = json.loads(path.read_text())
    namespace: dict = {"__name__": "__notebook__"}
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        exec(compile(source, f"{path.name}[cell {index}]", "exec"), namespace)
    assert capsys.readouterr().out  # the tour prints what it shows
