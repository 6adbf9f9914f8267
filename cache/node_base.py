"""What the nodes of both trees (`cache.node.TreeNode`, `cache.swa_node.SWANode`) share: the children-dict
key, walks along a node's root path and over its subtree, and dropping a whole tree's nodes (`reset`).

A node has `key` (RadixKey), `key_bytes` (its tokens' bytes), `value` (slots), `parent` (None for the root and
once removed from its tree) and `children` (child key -> node). Each subclass declares those slots.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Any

import numpy as np

from cache.errors import EvictLockedError, LockError
from cache.keys import TOKEN_DTYPE

_TOKEN_BYTES = np.dtype(TOKEN_DTYPE).itemsize


def child_key_of(key_bytes: bytes, page_size: int, bigram: bool, extra_key: Hashable | None) -> Hashable:
    """The children-dict key of a key whose token bytes start with `key_bytes`.

    It is the bytes of the tokens that make up the first page of units (`page_size` tokens, one more for
    bigrams), paired with the namespace when there is one. Callers pass at least that many bytes.
    """
    head = key_bytes[: (page_size + bigram) * _TOKEN_BYTES]
    return head if extra_key is None else (extra_key, head)


class NodeBase:
    """Base of both trees' nodes: methods only (no slots of its own)."""

    __slots__ = ()

    def child_key(self, page_size: int) -> Hashable:
        """This node's key in its parent's `children` dict (first page of units, with the namespace)."""
        return child_key_of(self.key_bytes, page_size, self.key.bigram, self.key.extra_key)

    def path_from_root(self) -> list[Any]:
        """Nodes from the root's child down to this node (empty for the root). O(depth)."""
        path = []
        node = self
        while node is not None and node.parent is not None:
            path.append(node)
            node = node.parent
        path.reverse()
        return path

    def path_below(self, root: Any) -> list[Any]:
        """`path_from_root`, checked: raises LockError unless this node is `root` or in `root`'s tree (not
        removed, not from another tree). O(depth)."""
        path = self.path_from_root()
        top = path[0].parent if path else self
        if top is not root:
            raise LockError(f"{self!r} is not in this tree (evicted, or from another tree)")
        return path

    def iter_below(self) -> Iterator[Any]:
        """Every node below this one (not itself), parents before children. O(subtree)."""
        stack = list(self.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())


def drop_all(allocator: Any, nodes: list[Any], num_locked: int) -> None:
    """Both trees' `reset` before it clears its state: raise EvictLockedError (nothing changed) if
    `num_locked` of the tree's `nodes` are locked; else free all their slots in one `allocator.free` and mark
    them dead."""
    if num_locked:
        raise EvictLockedError(f"reset with {num_locked} locked nodes; release the live requests first")
    if nodes:
        allocator.free(np.concatenate([n.value for n in nodes]))
    for node in nodes:
        node.parent = None
