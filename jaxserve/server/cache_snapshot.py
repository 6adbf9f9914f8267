"""Warm restart (`--cache-snapshot DIR`): the prefix tree and the KV of the slots it holds, saved to a
directory and restored into a fresh engine, so a prompt whose prefix was cached before the restart is
served from the cache again (`cached_tokens > 0`) with the same output.

Layout of DIR: `snapshot.json` (format version; the fingerprint; the tree's nodes parent-first, each with its
parent, key tokens, namespace and slot count; a sha256 of the KV rows) and `kv/`, an orbax checkpoint of the
saved slots' pool rows in storage dtype: `full` `[layers, n, 2 * kv_heads, head_dim]`, plus `swa` (hybrid
sliding-window models, at the slots' SWA slots) and `draft` (the EAGLE-3 head's pool) when the engine has
them; node i owns rows `[sum of the slot counts before it, + its count)`. A snapshot is written under a
temporary name beside DIR and renamed into place, so DIR is a whole snapshot or the previous one.

The fingerprint (target and draft weights, model config, page size, KV dtype, key mode, tokenizer) must
equal the new engine's; a missing, mismatched, partial or corrupt snapshot is refused with one log line and
the engine starts cold. Everything is checked before the engine is touched; then slots are allocated, the
rows written and the nodes inserted parent-first, so the tree has the saved structure (LRU order becomes
the insertion order). A tombstoned node's SWA KV is gone, so its subtree is not saved. Not thread-safe:
call between engine steps (the engine thread, or after it stopped).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx

from jaxserve.speculative.stepper import EagleStepper

logger = logging.getLogger("jaxserve.cache_snapshot")

FORMAT_VERSION = 1
META_FILE, KV_DIR = "snapshot.json", "kv"
_TOKENIZER_PROBE = "Warm restart probe: naïve café, 東京, 123 + 456 = 579 <|endoftext|>"


class SnapshotRefused(Exception):
    """The snapshot cannot be used for this engine; the message says why, in one line."""


@dataclasses.dataclass(frozen=True)
class SnapshotStats:
    """What a snapshot holds (as saved or restored): tree nodes and the KV slots they own."""

    num_nodes: int
    num_slots: int


def _sha256_arrays(arrays) -> str:
    digest = hashlib.sha256()
    for array in arrays:
        array = np.ascontiguousarray(np.asarray(array))
        digest.update(f"{array.dtype}{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def _state_hash(state: nnx.State) -> str:
    return _sha256_arrays(np.asarray(jax.device_get(var[...])) for _, var in nnx.to_flat_state(state))


def fingerprint(engine) -> dict[str, Any]:
    """What a snapshot's KV depends on: weights (O(parameters) to hash), config, page size, KV dtype, key mode
    (bigram keys under EAGLE), tokenizer behaviour on a probe text."""
    kv = engine.kv
    tok = engine.tokenizer
    spec = engine.stepper if isinstance(engine.stepper, EagleStepper) else None
    return {
        "weights": _state_hash(nnx.state(engine.model)),
        "draft_weights": _state_hash(spec.dparams) if spec is not None else None,
        "config": hashlib.sha256(json.dumps(engine.model.config.raw, sort_keys=True).encode()).hexdigest(),
        "page_size": kv.page_size,
        "kv_dtype": str(_pool_groups(engine)["full"].dtype),
        "bigram_keys": bool(kv.tree.eagle),
        "tokenizer": None if tok is None else _tokenizer_hash(tok),
    }


def _tokenizer_hash(tok) -> str:
    probe = [tok.encode(_TOKENIZER_PROBE), sorted(tok.eos_token_ids), tok.chat_template]
    return hashlib.sha256(json.dumps(probe).encode()).hexdigest()


def _pool_groups(engine) -> dict[str, Any]:
    """The engine's KV pools by snapshot name: `full`, and `swa` / `draft` when present."""
    pools = engine.kv.pools
    groups = {"full": pools.full, "swa": pools.swa} if engine.kv.hybrid else {"full": pools}
    if isinstance(engine.stepper, EagleStepper):
        groups["draft"] = engine.stepper.dpool
    return groups


def _set_pool_groups(engine, groups: dict[str, Any]) -> None:
    kv = engine.kv
    kv.pools = kv.pools.replace(full=groups["full"], swa=groups["swa"]) if kv.hybrid else groups["full"]
    if "draft" in groups:
        engine.stepper.dpool = groups["draft"]


def _export_nodes(tree) -> list[dict[str, Any]]:
    """Nodes parent-first (index order), without tombstones and their subtrees."""
    nodes, stack = [], [(child, -1) for child in tree.root.children.values()]
    while stack:
        node, parent = stack.pop()
        if getattr(node, "tombstone", False):
            continue
        extra = node.key.extra_key
        if extra is not None and not isinstance(extra, str | int):
            continue  # a namespace that JSON cannot carry: leave the subtree out
        nodes.append({"parent": parent, "tokens": node.key.tokens.tolist(), "extra_key": extra,
                      "slots": np.asarray(node.value, np.int64)})
        stack.extend((child, len(nodes) - 1) for child in node.children.values())
    return nodes


def save(engine, directory: str | Path) -> SnapshotStats:
    """Write the engine's prefix tree and its KV to `directory` (atomically replacing a previous snapshot).
    Returns what was saved."""
    import orbax.checkpoint as ocp

    directory = Path(directory).resolve()
    nodes = _export_nodes(engine.kv.tree)
    slots = np.concatenate([node["slots"] for node in nodes]) if nodes else np.zeros(0, np.int64)
    for node in nodes:
        node["num_slots"] = int(node.pop("slots").shape[0])
    rows = {name: np.asarray(pool.data[:, _group_slots(engine, name, slots)])
            for name, pool in _pool_groups(engine).items()}
    meta = {"format": FORMAT_VERSION, "fingerprint": fingerprint(engine), "nodes": nodes,
            "kv_sha256": _sha256_arrays(rows[name] for name in sorted(rows))}
    partial = directory.with_name(f".{directory.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        with ocp.StandardCheckpointer() as checkpointer:
            checkpointer.save(partial / KV_DIR, rows)
            checkpointer.wait_until_finished()
        (partial / META_FILE).write_text(json.dumps(meta))
        old = directory.with_name(f".{directory.name}.old-{os.getpid()}")
        if directory.exists():
            directory.rename(old)
        partial.rename(directory)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return SnapshotStats(num_nodes=len(nodes), num_slots=int(slots.shape[0]))


def _group_slots(engine, name: str, slots: np.ndarray) -> np.ndarray:
    """Pool rows of full `slots` in group `name` (the SWA pool is indexed by the mapped SWA slots)."""
    return np.asarray(engine.kv.allocator.swa_slots_of(slots)) if name == "swa" else slots


def _load(engine, directory: Path) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
    """Read and check `directory` against `engine`; raises SnapshotRefused naming the first problem."""
    import orbax.checkpoint as ocp

    if not (directory / META_FILE).is_file() or not (directory / KV_DIR).is_dir():
        raise SnapshotRefused(f"{directory} is not a complete snapshot (needs {META_FILE} and {KV_DIR}/)")
    try:
        meta = json.loads((directory / META_FILE).read_text())
        nodes, saved_print, kv_sha = meta["nodes"], meta["fingerprint"], meta["kv_sha256"]
        version = meta["format"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SnapshotRefused(f"{directory / META_FILE} is unreadable ({e!r})") from None
    if version != FORMAT_VERSION:
        raise SnapshotRefused(f"snapshot format {version}, this server reads {FORMAT_VERSION}")
    current = fingerprint(engine)
    differ = sorted(k for k in current.keys() | saved_print.keys() if current.get(k) != saved_print.get(k))
    if differ:
        raise SnapshotRefused(f"snapshot was taken with a different {', '.join(differ)}")
    groups = _pool_groups(engine)
    num_slots = sum(int(node["num_slots"]) for node in nodes)
    try:
        with ocp.StandardCheckpointer() as checkpointer:
            rows = checkpointer.restore((directory / KV_DIR).resolve())
        rows = {name: np.asarray(rows[name]) for name in groups}
    except Exception as e:  # orbax and tensorstore raise many types for a damaged checkpoint
        raise SnapshotRefused(f"{directory / KV_DIR} cannot be read ({type(e).__name__}: {e})") from None
    for name, pool in groups.items():
        want = (pool.data.shape[0], num_slots, *pool.data.shape[2:])
        if rows[name].shape != want or rows[name].dtype != pool.data.dtype:
            raise SnapshotRefused(f"{name} KV rows are {rows[name].dtype}{list(rows[name].shape)}, "
                                  f"expected {pool.data.dtype}{list(want)}")
    if _sha256_arrays(rows[name] for name in sorted(rows)) != kv_sha:
        raise SnapshotRefused("KV rows do not match their checksum (corrupt snapshot)")
    if any(not 0 <= int(n["parent"]) < i and n["parent"] != -1 for i, n in enumerate(nodes)):
        raise SnapshotRefused("node list is not parent-first (corrupt snapshot)")
    return nodes, rows


def restore(engine, directory: str | Path) -> SnapshotStats | None:
    """Put the snapshot at `directory` into `engine`, whose tree must be empty (a fresh engine). Returns what
    was restored, or None after logging one line saying why the engine starts cold."""
    directory = Path(directory)
    if not directory.exists():
        logger.info(f"cache snapshot: none at {directory}; starting cold")
        return None
    try:
        kv = engine.kv
        if kv.tree.num_nodes:
            raise SnapshotRefused(f"the engine's prefix cache already holds {kv.tree.num_nodes} nodes")
        nodes, rows = _load(engine, directory)
        num_slots = sum(int(node["num_slots"]) for node in nodes)
        if num_slots > kv.available_slots():
            raise SnapshotRefused(f"it holds {num_slots} KV slots, the pool has {kv.available_slots()} free")
    except SnapshotRefused as e:
        logger.warning(f"cache snapshot refused: {e}; starting cold")
        return None
    new_slots, paths = [], []
    for node in nodes:
        slots = kv.allocator.alloc(int(node["num_slots"]))
        parent_tokens, parent_slots = paths[node["parent"]] if node["parent"] >= 0 else ([], [])
        tokens = node["tokens"][1:] if kv.tree.eagle and parent_tokens else node["tokens"]
        paths.append((parent_tokens + tokens, parent_slots + slots.tolist()))
        new_slots.append(slots)
    all_slots = np.concatenate(new_slots) if new_slots else np.zeros(0, np.int64)
    written = {}
    for name, pool in _pool_groups(engine).items():
        at = _group_slots(engine, name, all_slots)
        written[name] = pool.replace(data=pool.data.at[:, at].set(rows[name]))
    _set_pool_groups(engine, written)
    for node, (tokens, slots) in zip(nodes, paths, strict=True):
        parent_units = len(slots) - int(node["num_slots"])
        kv.tree.insert(tokens, np.asarray(slots, np.int64), node["extra_key"], prev_prefix_len=parent_units)
    kv.check()
    logger.info(f"cache snapshot: restored {len(nodes)} nodes, {num_slots} KV slots from {directory}")
    return SnapshotStats(num_nodes=len(nodes), num_slots=num_slots)
