"""A readable drawing of a prefix tree for notebooks, logs and test failure messages.

`draw_tree` draws any tree of nodes with `children`, `key` (a RadixKey) and `value` (slots), one line per node
from a per-tree line function; `describe_node` is the part of a line both trees share. `format_tree` is the
plain tree's drawing (`RadixCache.pretty`); the SWA tree's is in `cache.swa_pretty`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _clip(values: list[int], max_items: int) -> str:
    head = ", ".join(str(v) for v in values[:max_items])
    return f"[{head}, ...]" if len(values) > max_items else f"[{head}]"


def describe_node(node: Any, max_units: int) -> str:
    """Tokens (bigram keys show their tokens, `n + 1` of them), unit count, mode, namespace and slots, each
    list clipped to `max_units` items."""
    key = node.key
    mode = " bigram" if key.bigram else ""
    extra = f" extra_key={key.extra_key!r}" if key.extra_key is not None else ""
    return (
        f"{_clip(key.tokens.tolist(), max_units + key.bigram)} ({node.num_units} units{mode}){extra} "
        f"slots={_clip(node.value.tolist(), max_units)}"
    )


def draw_tree(root: Any, header: str, line: Callable[[Any], str]) -> str:
    """`header`, then one `line(node)` per node below `root`, indented as a tree, children in order of their
    namespace and tokens. Deterministic for equal trees built in any order, so two drawings can be compared
    in tests. O(nodes)."""
    lines = [header]

    def order(node: Any) -> list[Any]:
        return sorted(node.children.values(), key=lambda c: (repr(c.key.extra_key), c.key.tokens.tolist()))

    stack = [(c, "", i == 0) for i, c in enumerate(reversed(order(root)))]
    while stack:
        node, indent, last = stack.pop()
        lines.append(f"{indent}{'└─ ' if last else '├─ '}{line(node)}")
        child_indent = indent + ("   " if last else "│  ")
        stack.extend((c, child_indent, i == 0) for i, c in enumerate(reversed(order(node))))
    return "\n".join(lines)


def format_node(node: Any, max_units: int) -> str:
    """One line of the plain tree: `describe_node`, then the lock count."""
    return f"{describe_node(node, max_units)} lock={node.lock_ref}"


def format_tree(root: Any, page_size: int, max_units: int = 8) -> str:
    """Draw the plain tree below `root` (see `draw_tree`)."""
    return draw_tree(root, f"root (page_size={page_size})", lambda node: format_node(node, max_units))
