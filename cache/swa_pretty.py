"""A readable drawing of an `SWARadixCache` for notebooks, logs and test failure messages."""

from __future__ import annotations

from typing import Any


def _clip(values: list[int], max_items: int) -> str:
    head = ", ".join(str(v) for v in values[:max_items])
    return f"[{head}, ...]" if len(values) > max_items else f"[{head}]"


def format_swa_node(node: Any, max_units: int) -> str:
    """One line: tokens (a bigram key shows its n + 1 tokens), units, full slots, locks, uuid, tombstone."""
    key = node.key
    mode = " bigram" if key.bigram else ""
    extra = f" extra_key={key.extra_key!r}" if key.extra_key is not None else ""
    uuid = f" uuid={node.swa_uuid}" if node.swa_uuid is not None else ""
    tomb = " TOMBSTONE" if node.tombstone else ""
    return (
        f"{_clip(key.tokens.tolist(), max_units + key.bigram)} ({node.num_units} units{mode}){extra} "
        f"slots={_clip(node.value.tolist(), max_units)} "
        f"lock=full:{node.full_lock_ref}/swa:{node.swa_lock_ref}{uuid}{tomb}"
    )


def format_swa_tree(tree: Any, max_units: int = 8) -> str:
    """Draw the tree, children in order of their first tokens (deterministic, comparable). O(nodes)."""
    lines = [
        f"root (W={tree.sliding_window}, page_size={tree.page_size}, eagle={tree.eagle}; "
        f"full evictable/protected {tree.full_evictable_size}/{tree.full_protected_size}, "
        f"swa {tree.swa_evictable_size}/{tree.swa_protected_size})"
    ]

    def order(node: Any) -> list[Any]:
        return sorted(node.children.values(), key=lambda c: (repr(c.key.extra_key), c.key.tokens.tolist()))

    stack = [(c, "", i == 0) for i, c in enumerate(reversed(order(tree.root)))]
    while stack:
        node, indent, last = stack.pop()
        lines.append(f"{indent}{'└─ ' if last else '├─ '}{format_swa_node(node, max_units)}")
        child_indent = indent + ("   " if last else "│  ")
        stack.extend((c, child_indent, i == 0) for i, c in enumerate(reversed(order(node))))
    return "\n".join(lines)
