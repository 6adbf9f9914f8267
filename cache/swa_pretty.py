"""A readable drawing of an `SWARadixCache` for notebooks, logs and test failures (layout: `cache.pretty`)."""

from __future__ import annotations

from typing import Any

from cache.pretty import describe_node, draw_tree


def format_swa_node(node: Any, max_units: int) -> str:
    """One line: tokens (a bigram key shows its n + 1 tokens), units, full slots, locks, uuid, tombstone."""
    uuid = f" uuid={node.swa_uuid}" if node.swa_uuid is not None else ""
    tomb = " TOMBSTONE" if node.tombstone else ""
    locks = f"lock=full:{node.full_lock_ref}/swa:{node.swa_lock_ref}"
    return f"{describe_node(node, max_units)} {locks}{uuid}{tomb}"


def format_swa_tree(tree: Any, max_units: int = 8) -> str:
    """Draw the tree, children in order of their first tokens (deterministic, comparable). O(nodes)."""
    header = (
        f"root (W={tree.sliding_window}, page_size={tree.page_size}, eagle={tree.eagle}; "
        f"full evictable/protected {tree.full_evictable_size}/{tree.full_protected_size}, "
        f"swa {tree.swa_evictable_size}/{tree.swa_protected_size})"
    )
    return draw_tree(tree.root, header, lambda node: format_swa_node(node, max_units))
