"""Warm restart: a snapshot of one engine's prefix tree and KV, restored into a fresh engine, serves a known
prefix from the cache (`cached_tokens > 0`) with the cold engine's output; SWA tombstones and the LRU order
survive the restart (the restored tree equals the saved one and evicts in the same order); a snapshot that
is missing, mismatched, partial, corrupt or of the older format is refused with one log line and leaves the
engine cold and untouched."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from jaxserve import Engine
from jaxserve.server import cache_snapshot

GREEDY = {"max_new_tokens": 8, "temperature": 0}
PROMPTS = ["The os module provides a portable way of using", "The os module provides functions for"]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> dict:
    """An engine that served PROMPTS (cold outputs recorded), then its snapshot."""
    engine = Engine()
    cold = [engine.generate(p, GREEDY) for p in PROMPTS]
    again = engine.generate(PROMPTS[0], GREEDY)  # what a warm repeat reports on the same engine
    directory = tmp_path_factory.mktemp("snap") / "snapshot"
    saved = cache_snapshot.save(engine, directory)
    return {"engine": engine, "cold": cold, "again": again, "dir": directory, "saved": saved}


@pytest.fixture(scope="module")
def untouched() -> Engine:
    """A fresh engine the refusal tests try to restore into; it must stay empty."""
    return Engine()


def test_restored_engine_serves_the_prefix_from_cache_with_the_same_output(source) -> None:
    assert source["saved"].num_nodes == source["engine"].kv.tree.num_nodes > 0
    engine = Engine()
    restored = cache_snapshot.restore(engine, source["dir"])
    assert restored == source["saved"]
    assert engine.kv.tree.num_nodes == source["engine"].kv.tree.num_nodes
    assert engine.kv.tree_slots() == source["engine"].kv.tree_slots()
    out = engine.generate(PROMPTS[0], GREEDY)
    assert out["meta_info"]["cached_tokens"] == source["again"]["meta_info"]["cached_tokens"] > 0
    assert out["output_ids"] == source["cold"][0]["output_ids"]
    second = engine.generate(PROMPTS[1], GREEDY)
    assert second["meta_info"]["cached_tokens"] > 0
    assert second["output_ids"] == source["cold"][1]["output_ids"]
    engine.check_memory()
    nodes = engine.kv.tree.num_nodes
    assert cache_snapshot.restore(engine, source["dir"]) is None  # only into an empty cache
    assert engine.kv.tree.num_nodes == nodes


def _without_slot_ids(tree) -> dict:
    """The tree's exported state as plain values, without its slot ids (they differ after a restart):
    structure, keys, tombstones and LRU orders."""
    state = dataclasses.asdict(tree.export_state())
    del state["slots"]
    return {name: value.tolist() if isinstance(value, np.ndarray) else value for name, value in state.items()}


def _drain(tree) -> list:
    """Evict the tree one unit at a time, SWA eviction (tombstoning) first: each step's freed counts and the
    tree left after it."""
    steps = []
    while getattr(tree, "swa_evictable_size", 0):  # the plain tree has no SWA side
        steps.append((tree.evict(0, 1), _without_slot_ids(tree)))
    while tree.num_nodes:
        steps.append((tree.evict(1), _without_slot_ids(tree)))
    return steps


def test_swa_tombstones_and_the_lru_order_survive_a_restart(tmp_path: Path) -> None:
    """A root-side node tombstoned by SWA eviction is saved with its full KV and restored as a tombstone; a
    prompt matched through it is served from the cache with the cold output; the restored tree evicts and
    tombstones in the saved order."""
    engine = Engine()
    tree = engine.kv.tree
    assert engine.kv.hybrid and not tree.eagle
    window = tree.sliding_window
    rng = np.random.RandomState(7)
    prompt = rng.randint(1, 512, size=2 * window + 8).tolist()
    cold = engine.generate(input_ids=prompt, sampling_params=GREEDY)
    tree.match_prefix(prompt[:window])  # splits the prompt's node after `window` tokens
    tree.match_prefix(prompt)  # its upper half is now less recent than the lower
    engine.generate(input_ids=rng.randint(1, 512, size=window).tolist(), sampling_params=GREEDY)
    tree.evict(0, window)  # tombstones the prompt's upper half, the least recent node
    state = tree.export_state()
    assert state.tombstone.sum() == 1
    tomb = int(np.flatnonzero(state.tombstone)[0])
    assert state.parents[tomb] == -1 and state.node_tokens(tomb).tolist() == prompt[:window]
    saved = cache_snapshot.save(engine, tmp_path / "snapshot")
    restored_engine = Engine()
    assert cache_snapshot.restore(restored_engine, tmp_path / "snapshot") == saved
    restored = restored_engine.kv.tree
    restored.check_invariants()
    assert _without_slot_ids(restored) == _without_slot_ids(tree)
    warm = restored_engine.generate(input_ids=prompt, sampling_params=GREEDY)
    again = engine.generate(input_ids=prompt, sampling_params=GREEDY)
    assert warm["meta_info"]["cached_tokens"] == again["meta_info"]["cached_tokens"] > window
    assert warm["output_ids"] == again["output_ids"] == cold["output_ids"]
    assert _drain(restored) == _drain(tree)
    restored_engine.check_memory()


def test_a_plain_tree_restores_its_lru_order(tmp_path: Path) -> None:
    """A full-attention model (the plain tree): the prefix touched last before the save is evicted last
    after the restore, as in the saved engine (restoring in insertion order would evict it first)."""
    from tests.server.checkpoint import write_tiny_checkpoint

    model = str(write_tiny_checkpoint(tmp_path / "llama"))
    engine = Engine(model_path=model)
    assert not engine.kv.hybrid
    rng = np.random.RandomState(5)
    shared = rng.randint(1, 512, size=12).tolist()
    first, second = (shared + rng.randint(1, 512, size=6).tolist() for _ in range(2))
    cold = [engine.generate(input_ids=p, sampling_params=GREEDY) for p in (first, second)]
    engine.kv.tree.match_prefix(first)  # the first prompt's path becomes the most recent
    saved = cache_snapshot.save(engine, tmp_path / "snapshot")
    restored_engine = Engine(model_path=model)
    assert cache_snapshot.restore(restored_engine, tmp_path / "snapshot") == saved
    restored = restored_engine.kv.tree
    assert _without_slot_ids(restored) == _without_slot_ids(engine.kv.tree)
    warm = restored_engine.generate(input_ids=second, sampling_params=GREEDY)
    assert warm["meta_info"]["cached_tokens"] > 0 and warm["output_ids"] == cold[1]["output_ids"]
    engine.generate(input_ids=second, sampling_params=GREEDY)
    assert _drain(restored) == _drain(engine.kv.tree)
    restored_engine.check_memory()


def test_a_tree_locked_by_a_live_request_is_not_saved(source, tmp_path: Path) -> None:
    engine = source["engine"]
    tree = engine.kv.tree
    node = next(iter(tree.iter_nodes()))
    lock_id = tree.inc_lock_ref(node)
    try:
        with pytest.raises(cache_snapshot.SnapshotRefused, match="locked"):
            cache_snapshot.save(engine, tmp_path / "snapshot")
    finally:
        tree.dec_lock_ref(node, lock_id)
    assert not (tmp_path / "snapshot").exists()


def test_saving_again_replaces_the_snapshot_whole(source, tmp_path: Path) -> None:
    target = tmp_path / "snap"
    cache_snapshot.save(source["engine"], target)
    (target / "stale-file").write_text("from the previous snapshot")
    cache_snapshot.save(source["engine"], target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snap"]  # no partial or old sibling left behind
    assert sorted(p.name for p in target.iterdir()) == ["kv", "snapshot.json"]


def _edit_meta(directory: Path, edit) -> None:
    meta = json.loads((directory / "snapshot.json").read_text())
    edit(meta)
    (directory / "snapshot.json").write_text(json.dumps(meta))


def _flip_kv_bytes(directory: Path) -> None:
    data = max((p for p in (directory / "kv").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    raw = bytearray(data.read_bytes())
    middle = len(raw) // 2
    raw[middle:middle + 16] = bytes(b ^ 0xFF for b in raw[middle:middle + 16])
    data.write_bytes(bytes(raw))


DAMAGE = {
    "other weights": (lambda d: _edit_meta(d, lambda m: m["fingerprint"].update(weights="0" * 64)),
                      "weights"),
    "other key mode": (lambda d: _edit_meta(d, lambda m: m["fingerprint"].update(bigram_keys=True)),
                       "bigram_keys"),
    "other format": (lambda d: _edit_meta(d, lambda m: m.update(format=99)), "format"),
    "no kv": (lambda d: shutil.rmtree(d / "kv"), "not a complete snapshot"),
    "kv data lost": (lambda d: [shutil.rmtree(p) for p in (d / "kv").iterdir() if p.is_dir()], "kv"),
    "no metadata": (lambda d: (d / "snapshot.json").unlink(), "not a complete snapshot"),
    "truncated metadata": (lambda d: (d / "snapshot.json").write_text('{"format": 1, "nod'), "unreadable"),
    "flipped kv bytes": (_flip_kv_bytes, "kv"),
    "a node without its parent": (lambda d: _edit_meta(d, lambda m: m["tree"]["parents"].__setitem__(0, 5)),
                                  "parent-first"),
    "format 1 (no tombstones, no LRU order)": (lambda d: _edit_meta(d, _as_format_1), "format 1"),
    "format 2 without its tree": (lambda d: _edit_meta(d, lambda m: m.pop("tree")), "unreadable"),
}


def _as_format_1(meta: dict) -> None:
    """The layout format 1 wrote: a node list with slot counts, no tombstone flags, no LRU order."""
    tree = meta.pop("tree")
    offsets = tree["token_offsets"]
    meta["format"] = 1
    meta["nodes"] = [{"parent": parent, "tokens": tree["tokens"][offsets[i]:offsets[i + 1]],
                      "extra_key": None, "num_slots": offsets[i + 1] - offsets[i]}
                     for i, parent in enumerate(tree["parents"])]


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_bad_snapshot_is_refused_in_one_line_and_the_engine_stays_cold(source, untouched, tmp_path,
                                                                       caplog, damage: str) -> None:
    broken = tmp_path / "snapshot"
    shutil.copytree(source["dir"], broken)
    spoil, reason = DAMAGE[damage]
    spoil(broken)
    free = untouched.kv.available_slots()
    with caplog.at_level(logging.INFO, logger="jaxserve.cache_snapshot"):
        assert cache_snapshot.restore(untouched, broken) is None
    lines = [r.getMessage() for r in caplog.records if r.name == "jaxserve.cache_snapshot"]
    assert len(lines) == 1 and "refused" in lines[0] and reason.lower() in lines[0].lower(), lines
    assert untouched.kv.tree.num_nodes == 0 and untouched.kv.available_slots() == free


def test_an_engine_with_another_page_size_refuses_the_snapshot(source, caplog) -> None:
    engine = Engine(page_size=4)
    with caplog.at_level(logging.INFO, logger="jaxserve.cache_snapshot"):
        assert cache_snapshot.restore(engine, source["dir"]) is None
    assert any("different page_size" in r.getMessage() for r in caplog.records)
    assert engine.kv.tree.num_nodes == 0


def test_no_snapshot_starts_cold_and_a_refused_engine_serves_cold(source, untouched, tmp_path,
                                                                 caplog) -> None:
    with caplog.at_level(logging.INFO, logger="jaxserve.cache_snapshot"):
        assert cache_snapshot.restore(untouched, tmp_path / "absent") is None
    assert any("starting cold" in r.getMessage() for r in caplog.records)
    out = untouched.generate(PROMPTS[0], GREEDY)
    assert out["meta_info"]["cached_tokens"] == 0 and out["output_ids"] == source["cold"][0]["output_ids"]


def test_a_server_restarted_on_its_snapshot_serves_the_prefix_warm(tmp_path: Path) -> None:
    """The server path end to end (the embedded default with its EAGLE-3 head, so the draft's KV is in the
    snapshot too): cold start, POST /save_cache, graceful shutdown saves again, the restart restores."""
    import httpx

    from tests.server.conftest import ServerProcess

    flags = ["--cache-snapshot", str(tmp_path / "snapshot")]
    body = {"text": PROMPTS[0], "sampling_params": {"max_new_tokens": 12, "temperature": 0}}
    first = ServerProcess(flags)
    try:
        with httpx.Client(base_url=first.url, timeout=300) as client:
            cold = client.post("/generate", json=body).json()
            saved = client.post("/save_cache").json()
    finally:
        assert first.stop() == 0, "".join(first.stderr[-20:])
    assert cold["meta_info"]["cached_tokens"] == 0 and saved["success"] and saved["num_nodes"] > 0
    assert any("starting cold" in line for line in first.stderr)
    assert any("cache snapshot: saved" in line for line in first.stderr)  # again, at shutdown
    second = ServerProcess(flags)
    try:
        with httpx.Client(base_url=second.url, timeout=300) as client:
            warm = client.post("/generate", json=body).json()
    finally:
        assert second.stop() == 0, "".join(second.stderr[-20:])
    assert any("cache snapshot: restored" in line for line in second.stderr)
    assert warm["meta_info"]["cached_tokens"] > 0
    assert warm["output_ids"] == cold["output_ids"] and warm["text"] == cold["text"]


def test_save_cache_without_a_snapshot_directory_is_a_400() -> None:
    from fastapi.testclient import TestClient

    from jaxserve.server.app import create_app

    app = create_app(Engine())
    with TestClient(app) as client:
        response = client.post("/save_cache")
    assert response.status_code == 400 and "--cache-snapshot" in response.json()["message"]
