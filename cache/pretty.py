"""A readable drawing of a prefix tree for notebooks, logs and test failure messages."""

from __future__ import annotations

from typing import Any


def _clip(values: list[int], max_items: int) -> str:
    head = ", ".join(str(v) for v in values[:max_items])
    return f"[{head}, ...]" if len(values) > max_items else f"[{head}]"


def format_node(node: Any, max_units: int) -> str:
    """One line: tokens (bigram keys show their tokens, `n + 1` of them), unit count, slots, lock count."""
    key = node.key
    mode = " bigram" if key.bigram else ""
    extra = f" extra_key={key.extra_key!r}" if key.extra_key is not None else ""
    return (
        f"{_clip(key.tokens.tolist(), max_units + key.bigram)} ({node.num_units} units{mode}){extra} "
        f"slots={_clip(node.value.tolist(), max_units)} lock={node.lock_ref}"
    )


def format_tree(root: Any, page_size: int, max_units: int = 8) -> str:
    """Draw the tree below `root`, children in order of their first tokens. Deterministic for equal trees
    built in any order, so two drawings can be compared in tests. O(nodes)."""
    lines = [f"root (page_size={page_size})"]

    def order(node: Any) -> list[Any]:
        return sorted(node.children.values(), key=lambda c: (repr(c.key.extra_key), c.key.tokens.tolist()))

    stack = [(child, "", i == len(kids) - 1) for kids in [order(root)] for i, child in enumerate(kids)][::-1]
    while stack:
        node, indent, last = stack.pop()
        lines.append(f"{indent}{'└─ ' if last else '├─ '}{format_node(node, max_units)}")
        kids = order(node)
        child_indent = indent + ("   " if last else "│  ")
        stack.extend((c, child_indent, i == len(kids) - 1) for i, c in reversed(list(enumerate(kids))))
    return "\n".join(lines)
