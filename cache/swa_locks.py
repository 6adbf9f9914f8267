"""Locks of the SWA tree: a lock full-locks a node's whole root path against eviction and
SWA-locks only its last `sliding_window` units (whole nodes) against SWA eviction (tombstoning).

`inc_lock_ref` walks up from the node; the node where the SWA coverage reaches the window gets a `swa_uuid`
(kept if it has one) and that uuid is the lock id the caller stores (`req.lock_id`) and passes back to
`dec_lock_ref`, which SWA-unlocks up to and including the node carrying it. uuids are per node, not per lock:
two locks whose windows end on the same node share it, which is fine because each dec stops there. A split
moves the uuid to the upper half, so a dec from below still unlocks the same nodes. A path shorter than the
window gets lock id None and is SWA-locked to the root.

Accounting: a node's units move from evictable to protected when its lock count leaves 0, on each side.
"""

from __future__ import annotations

from itertools import count

from cache.errors import LockError
from cache.swa_node import SWANode

_swa_uuids = count(1)


class SWALockOps:
    """Mixin for `SWARadixCache`: `inc_lock_ref` / `dec_lock_ref` and the path helpers they share. Uses the
    tree's `root`, `sliding_window`, `disabled` and its four size counters."""

    def _path(self, node: SWANode) -> list[SWANode]:
        """`node`'s root path; LockError unless `node` is in this tree."""
        return node.path_below(self.root)

    def _swa_lock_span(self, path: list[SWANode]) -> int:
        """How many nodes, from the bottom of `path`, an `inc_lock_ref` SWA-locks: up to and including the
        one where the running sum of units reaches the window (all of them if it never does)."""
        covered = 0
        for depth, node in enumerate(reversed(path), 1):
            covered += node.num_units
            if covered >= self.sliding_window:
                return depth
        return len(path)

    def inc_lock_ref(self, node: SWANode) -> int | None:
        """Lock `node`'s root path against full eviction and its last `sliding_window` units (whole nodes)
        against SWA eviction. Returns the lock id (the swa_uuid of the node where SWA coverage reached the
        window, or None when the path is shorter than the window); pass it to `dec_lock_ref`. O(depth).

        Raises LockError (tree unchanged) if a node to be SWA-locked is a tombstone or `node` is not in the
        tree. Locking the root is a no-op. Disabled tree: returns None.
        """
        if self.disabled:
            return None
        return self._lock_path(self._path(node), node)

    def _lock_path(self, path: list[SWANode], node: SWANode) -> int | None:
        """`inc_lock_ref(node)` given `node`'s root path (root's child first), known to be in this tree."""
        span = self._swa_lock_span(path)
        swa_part = path[len(path) - span :]
        if any(n.tombstone for n in swa_part):
            raise LockError(f"cannot lock {node!r}: its last {self.sliding_window} units include a tombstone")
        for n in path[: len(path) - span]:
            self._lock_full(n)
        for n in swa_part:
            self._lock_full(n)
            if n.swa_lock_ref == 0:
                self._swa_evictable -= n.num_units
                self._swa_protected += n.num_units
            n.swa_lock_ref += 1
        if not swa_part or sum(n.num_units for n in swa_part) < self.sliding_window:
            return None
        top = swa_part[0]
        if top.swa_uuid is None:
            top.swa_uuid = next(_swa_uuids)
        return top.swa_uuid

    def _lock_full(self, n: SWANode) -> None:
        if n.full_lock_ref == 0:
            self._full_evictable -= n.num_units
            self._full_protected += n.num_units
        n.full_lock_ref += 1

    def dec_lock_ref(self, node: SWANode, lock_id: int | None = None) -> None:
        """Undo one `inc_lock_ref(node)` that returned `lock_id`: full-unlock the root path, SWA-unlock from
        `node` up to and including the node whose swa_uuid is `lock_id` (to the root when None).

        Raises LockError (tree unchanged) if a node on the path holds no such lock, `lock_id` is not on the
        path, or `node` is not in the tree. Disabled tree: no-op.
        """
        if self.disabled:
            return
        self._unlock_path(self._path(node), node, lock_id)

    def _unlock_path(self, path: list[SWANode], node: SWANode, lock_id: int | None) -> None:
        """`dec_lock_ref(node, lock_id)` given `node`'s root path (root's child first), already checked to be
        in this tree."""
        if lock_id is None:
            span = len(path)
        else:
            span = next((d for d, n in enumerate(reversed(path), 1) if n.swa_uuid == lock_id), 0)
            if not span:
                raise LockError(f"lock id {lock_id} is not on the path of {node!r}")
        swa_part = path[len(path) - span :]
        no_full = any(n.full_lock_ref <= 0 for n in path)
        if no_full or any(n.swa_lock_ref <= 0 or n.tombstone for n in swa_part):
            raise LockError(f"unlocking {node!r} (lock id {lock_id}), but its path does not hold that lock")
        for n in path:
            if n.full_lock_ref == 1:
                self._full_evictable += n.num_units
                self._full_protected -= n.num_units
            n.full_lock_ref -= 1
        for n in swa_part:
            if n.swa_lock_ref == 1:
                self._swa_evictable += n.num_units
                self._swa_protected -= n.num_units
            n.swa_lock_ref -= 1

