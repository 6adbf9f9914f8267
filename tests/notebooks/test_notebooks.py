"""Every notebook in notebooks/ runs top to bottom in a real Jupyter kernel (nbclient + ipykernel, headless,
offline), every cell tagged `plot` displays an image, and what the notebook computes holds: each notebook
ends by binding `summary`, a dict the test reads back through one extra cell and checks below against
references the notebook computes another way (a dense recompute, a single request, a closed-form count).
Notebooks are stored without outputs."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
MARK = "__NOTEBOOK_SUMMARY__"
READ_SUMMARY = f"import json as _json\nprint({MARK!r} + _json.dumps(summary, default=float))"


def execute(path: Path) -> tuple[nbformat.NotebookNode, dict]:
    """Run `path` in a fresh python3 kernel (working directory: the clone); returns the executed notebook
    (without the summary cell) and its `summary`."""
    notebook = nbformat.read(path, as_version=4)
    notebook.cells.append(nbformat.v4.new_code_cell(READ_SUMMARY))
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT)}}).execute()
    summary_cell = notebook.cells.pop()
    text = "".join(o.get("text", "") for o in summary_cell.outputs if o.output_type == "stream")
    return notebook, json.loads(text.split(MARK, 1)[1])


def plot_cells_show_images(notebook: nbformat.NotebookNode) -> int:
    plots = [c for c in notebook.cells if "plot" in c.get("metadata", {}).get("tags", [])]
    for cell in plots:
        assert any("image/png" in o.get("data", {}) for o in cell.outputs), f"no image from:\n{cell.source}"
    return len(plots)


def check_quickstart(summary: dict, num_plots: int) -> None:
    assert len(summary["ids"]) == 12 and summary["text"]
    assert summary["streamed_ids"] == summary["ids"] and summary["streamed_text"] == summary["text"]
    assert summary["batch_prompts"][0] == "The os module provides"
    assert summary["batch_ids"][0] == summary["ids"]  # batched == alone (greedy)
    assert all(len(ids) == 12 for ids in summary["batch_ids"])
    assert summary["cached_first"] == 0 and 0 < summary["cached_again"] < summary["prompt_tokens"]
    assert summary["openai_text"] == summary["text"]  # the server's greedy completion is the engine's
    assert summary["server_exit"] == 0


def radix_node_count(sequences: list[list[int]], bigram: bool) -> int:
    """Nodes of a compressed trie over `sequences` (units: tokens or adjacent pairs), by brute force: a
    prefix is a node when a sequence ends there or it continues in two or more ways."""
    keys = [list(itertools.pairwise(s)) if bigram else list(s) for s in sequences]
    prefixes = {tuple(k[:n]) for k in keys for n in range(1, len(k) + 1)}
    ends = {tuple(k) for k in keys}

    def continuations(prefix: tuple) -> set:
        return {k[len(prefix)] for k in keys if len(k) > len(prefix) and tuple(k[: len(prefix)]) == prefix}

    return sum(p in ends or len(continuations(p)) > 1 for p in prefixes)


def check_prefix_cache_tour(summary: dict, num_plots: int) -> None:
    assert num_plots == 4  # the shared tree, token vs bigram view, tombstones, hit rate
    assert summary["shared_match"] == 3
    prompts = [[100, 109], [100, 101, 109], [100, 101, 102, 109]]
    assert summary["token_nodes"] == radix_node_count(prompts, bigram=False)
    assert summary["bigram_nodes"] == radix_node_count(prompts, bigram=True)
    # SWA tree [1,2,3] -> [4..7], window 4, after SWA eviction of 3: the root-side node is the tombstone; a
    # match needs 4 live tokens after it (the whole [4..7]) or falls back to the root
    assert summary["tombstones"] == 1
    assert summary["window_matches"] == {"[1, 2, 3, 4, 5, 6, 7]": 7, "[1, 2, 3, 4]": 0}
    n, length = summary["num_requests"], summary["prompt_tokens"]
    expected = [(n - 1) * min(round(f * length), length - 1) / (n * length) for f in summary["fractions"]]
    assert summary["hit_rates"] == pytest.approx(expected)  # request 1 computes all; later ones reuse


def check_speculative_decoding(summary: dict, num_plots: int) -> None:
    assert num_plots == 2
    runs = [summary[name] for name in ("radix, bigram keys", "radix disabled", "radix, token keys (control)")]
    bigram, disabled, token = runs
    assert bigram["ids"] == disabled["ids"] == token["ids"] and len(bigram["ids"]) == 20  # lossless
    for run in runs:
        assert sum(run["histogram"]) == run["verify_rounds"]
        assert run["acc_length"] == pytest.approx(20 / run["verify_rounds"])
    assert bigram["cached_tokens"] > 0 and token["cached_tokens"] > 0 and disabled["cached_tokens"] == 0
    assert bigram["acc_length"] == disabled["acc_length"]  # bigram keys: a cache hit changes nothing
    assert token["acc_length"] < bigram["acc_length"]  # token keys: stale draft KV costs acceptance
    assert summary["same_tokens"] == [True, True]
    assert all(v > 0 for values in summary["throughput"].values() for v in values)


def check_your_own_flax_loop(summary: dict, num_plots: int) -> None:
    for name in ("decode_error", "rollback_error", "radix_error"):
        assert summary[name] < 1e-5, name  # paged steps == dense recompute
    assert summary["free_during"] < summary["free_before"] == summary["free_after"]
    assert summary["drafted_free"]
    page = summary["page_size"]
    cap = min(summary["shared_tokens"], summary["prompt_b_tokens"] - 1)  # one prompt token is recomputed
    assert summary["reused"] == cap // page * page
    assert summary["ownership"]["live_only_pages"] == 0


CHECKS = {"00_quickstart": check_quickstart, "01_prefix_cache_tour": check_prefix_cache_tour,
          "02_speculative_decoding": check_speculative_decoding,
          "03_your_own_flax_loop": check_your_own_flax_loop}


def test_notebooks_are_stored_without_outputs() -> None:
    assert {p.stem for p in NOTEBOOKS} == set(CHECKS)
    for path in NOTEBOOKS:
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, f"{path.name} has outputs"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_in_a_kernel_and_its_results_hold(path: Path) -> None:
    notebook, summary = execute(path)
    CHECKS[path.stem](summary, plot_cells_show_images(notebook))
