"""Warm restart (`--cache-snapshot DIR`): the prefix tree and the KV of the slots it holds, saved to a
directory and restored into a fresh engine, so a prompt whose prefix was cached before the restart is
served from the cache again (`cached_tokens > 0`) with the same output.

Layout of DIR: `snapshot.json` (format version; the fingerprint; the tree as `cache.TreeState` fields: nodes
parent-first with their parent, key tokens, namespace and full slots, SWA tombstone flags, and the full and
SWA LRU orders; a sha256 of the KV rows) and `kv/`, an orbax checkpoint of the saved slots' pool rows in
storage dtype: `full` `[layers, n, 2 * kv_heads, head_dim]` at every node's full slots in node order, plus
`swa` (hybrid sliding-window models: at the SWA slots of the live nodes only, a tombstone has no SWA KV) and
`draft` (the EAGLE-3 head's pool, indexed like `full`) when the engine has them. A snapshot is written under
a temporary name beside DIR and renamed into place, so DIR is a whole snapshot or the previous one.

The fingerprint (target and draft weights, model config, page size, KV dtype, key mode, tokenizer) must
equal the new engine's; a missing, mismatched, partial, corrupt or older-format snapshot is refused with one
log line and the engine starts cold. Everything is checked before the engine is touched; then fresh slots
are allocated for the saved tree (`cache.allocate_state_slots`: tombstones get full slots only), the rows
written and the tree imported (`import_state`), so the restored tree equals the saved one: structure,
tombstones and eviction order. Saving needs a tree without locks (no live request); otherwise it is refused.
Not thread-safe: call between engine steps (the engine thread, or after it stopped).
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

from cache import StateError, TreeState, allocate_state_slots
from jaxserve.speculative.stepper import EagleStepper

logger = logging.getLogger("jaxserve.cache_snapshot")

FORMAT_VERSION = 2  # 2: the tree as TreeState fields (tombstones, LRU orders); 1 had no such fields
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


_STATE_ARRAYS = {"parents": np.int64, "token_offsets": np.int64, "tokens": np.int64, "slots": np.int64,
                 "full_lru": np.int64}
_SWA_ARRAYS = {"tombstone": np.bool_, "swa_lru": np.int64}


def _state_to_json(state: TreeState) -> dict[str, Any]:
    if any(k is not None and not isinstance(k, str | int) for k in state.extra_keys):
        raise SnapshotRefused("the tree has a namespace (extra_key) that JSON cannot carry")
    out = {"page_size": state.page_size, "eagle": state.eagle, "sliding_window": state.sliding_window,
           "extra_keys": list(state.extra_keys)}
    for name in (*_STATE_ARRAYS, *_SWA_ARRAYS):
        value = getattr(state, name)
        out[name] = None if value is None else value.tolist()
    return out


def _state_from_json(tree: dict[str, Any]) -> TreeState:
    """Raises KeyError / TypeError / ValueError on a damaged entry (the caller refuses the snapshot)."""
    arrays = {name: np.asarray(tree[name], dtype) for name, dtype in _STATE_ARRAYS.items()}
    swa = {name: None if tree[name] is None else np.asarray(tree[name], dtype)
           for name, dtype in _SWA_ARRAYS.items()}
    window = tree["sliding_window"]
    return TreeState(page_size=int(tree["page_size"]), eagle=bool(tree["eagle"]),
                     extra_keys=tuple(tree["extra_keys"]),
                     sliding_window=None if window is None else int(window), **arrays, **swa)


def _row_slots(engine, state: TreeState) -> dict[str, np.ndarray]:
    """Pool rows of the state's KV in each group: full and draft rows at every full slot in node order,
    SWA rows at the SWA slots mapped behind the live nodes' full slots."""
    rows = {name: state.slots for name in _pool_groups(engine)}
    if "swa" in rows:
        live = np.repeat(state.live, state.num_units)
        rows["swa"] = np.asarray(engine.kv.allocator.swa_slots_of(state.slots[live]))
    return rows


def save(engine, directory: str | Path) -> SnapshotStats:
    """Write the engine's prefix tree and its KV to `directory` (atomically replacing a previous snapshot).
    Returns what was saved. Raises SnapshotRefused, writing nothing, while a live request locks the tree."""
    import orbax.checkpoint as ocp

    directory = Path(directory).resolve()
    try:
        state = engine.kv.tree.export_state()
    except StateError as e:
        raise SnapshotRefused(f"cannot save now: {e}") from None
    at = _row_slots(engine, state)
    rows = {name: np.asarray(pool.data[:, at[name]]) for name, pool in _pool_groups(engine).items()}
    meta = {"format": FORMAT_VERSION, "fingerprint": fingerprint(engine), "tree": _state_to_json(state),
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
    return SnapshotStats(num_nodes=state.num_nodes, num_slots=int(state.slots.shape[0]))


def _load(engine, directory: Path) -> tuple[TreeState, dict[str, np.ndarray]]:
    """Read and check `directory` against `engine`; raises SnapshotRefused naming the first problem."""
    import orbax.checkpoint as ocp

    if not (directory / META_FILE).is_file() or not (directory / KV_DIR).is_dir():
        raise SnapshotRefused(f"{directory} is not a complete snapshot (needs {META_FILE} and {KV_DIR}/)")
    try:
        meta = json.loads((directory / META_FILE).read_text())
        version = meta["format"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SnapshotRefused(f"{directory / META_FILE} is unreadable ({e!r})") from None
    if version != FORMAT_VERSION:
        raise SnapshotRefused(f"snapshot format {version}, this server reads {FORMAT_VERSION}")
    try:
        saved_print, kv_sha = meta["fingerprint"], meta["kv_sha256"]
        state = _state_from_json(meta["tree"])
    except (ValueError, KeyError, TypeError) as e:
        raise SnapshotRefused(f"{directory / META_FILE} is unreadable ({e!r})") from None
    current = fingerprint(engine)
    differ = sorted(k for k in current.keys() | saved_print.keys() if current.get(k) != saved_print.get(k))
    if differ:
        raise SnapshotRefused(f"snapshot was taken with a different {', '.join(differ)}")
    tree = engine.kv.tree
    window = tree.sliding_window if engine.kv.hybrid else None
    if (state.page_size, state.eagle, state.sliding_window) != (tree.page_size, tree.eagle, window):
        raise SnapshotRefused(f"the saved tree has page_size={state.page_size}, eagle={state.eagle}, "
                              f"sliding_window={state.sliding_window}; this engine's has {tree.page_size}, "
                              f"{tree.eagle}, {window}")
    try:
        state.check()
    except StateError as e:
        raise SnapshotRefused(f"the saved tree is invalid ({e}; corrupt snapshot)") from None
    groups = _pool_groups(engine)
    num_live = int(state.num_units[state.live].sum())
    try:
        with ocp.StandardCheckpointer() as checkpointer:
            rows = checkpointer.restore((directory / KV_DIR).resolve())
        rows = {name: np.asarray(rows[name]) for name in groups}
    except Exception as e:  # orbax and tensorstore raise many types for a damaged checkpoint
        raise SnapshotRefused(f"{directory / KV_DIR} cannot be read ({type(e).__name__}: {e})") from None
    for name, pool in groups.items():
        want = (pool.data.shape[0], num_live if name == "swa" else state.slots.shape[0], *pool.data.shape[2:])
        if rows[name].shape != want or rows[name].dtype != pool.data.dtype:
            raise SnapshotRefused(f"{name} KV rows are {rows[name].dtype}{list(rows[name].shape)}, "
                                  f"expected {pool.data.dtype}{list(want)}")
    if _sha256_arrays(rows[name] for name in sorted(rows)) != kv_sha:
        raise SnapshotRefused("KV rows do not match their checksum (corrupt snapshot)")
    return state, rows


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
        state, rows = _load(engine, directory)
        num_slots, live_slots = int(state.slots.shape[0]), int(state.num_units[state.live].sum())
        if kv.hybrid:  # tombstones take SWA slots for a moment (`allocate_state_slots`)
            need = (num_slots, max(live_slots, num_slots - live_slots))
            free = (kv.allocator.full_available_size(), kv.allocator.swa_available_size())
        else:
            need, free = (num_slots, 0), (kv.allocator.available_size(), 0)
        if need[0] > free[0] or need[1] > free[1]:
            raise SnapshotRefused(f"it needs {need[0]} full / {need[1]} SWA KV slots, the pool has "
                                  f"{free[0]} / {free[1]} free")
    except SnapshotRefused as e:
        logger.warning(f"cache snapshot refused: {e}; starting cold")
        return None
    state = allocate_state_slots(state, kv.allocator)
    at = _row_slots(engine, state)
    _set_pool_groups(engine, {name: pool.replace(data=pool.data.at[:, at[name]].set(rows[name]))
                              for name, pool in _pool_groups(engine).items()})
    kv.tree.import_state(state)
    kv.check()
    logger.info(f"cache snapshot: restored {state.num_nodes} nodes ({int((~state.live).sum())} tombstones), "
                f"{num_slots} KV slots from {directory}")
    return SnapshotStats(num_nodes=state.num_nodes, num_slots=num_slots)
