"""A node of the plain prefix tree (`cache.radix_cache.RadixCache`).

Units: a node's key has `n` units (tokens, or EAGLE bigrams) and its value holds exactly `n` full-attention
slot ids, unit `i` -> `value[i]`. With `page_size > 1`, `n` is a multiple of the page size and the value is
whole pages (`value[j*P : (j+1)*P]` is one page, in order).

Invariants between calls (checked by `RadixCache.check_invariants`):
- the root has an empty key/value, no parent, and is never evicted nor locked by a count;
- `parent.children[node.child_key] is node` for every non-root node, and a child key is the first page of the
  node's key (see `TreeNode.child_key`);
- `lock_ref >= 0`, and a node's `lock_ref` is at least each child's (locks cover whole root paths);
- `key_bytes == key.tokens.tobytes()` (cached so that key comparisons are one memcmp).
`child_key`, `path_from_root`, `path_below` and `iter_below` are shared with the SWA tree's node
(`cache.node_base`).
A node removed from the tree has `parent is None` (and is not the root): it is dead and must not be used.
"""

from __future__ import annotations

from collections.abc import Hashable
from itertools import count

import numpy as np

from cache.keys import RadixKey
from cache.node_base import NodeBase

_ids = count()


class TreeNode(NodeBase):
    """One edge of the radix tree: a key (units), its slots, children, lock count and LRU stamp."""

    __slots__ = (
        "children",
        "id",
        "key",
        "key_bytes",
        "last_access",
        "lock_ref",
        "num_units",
        "parent",
        "value",
    )

    def __init__(
        self,
        key: RadixKey,
        value: np.ndarray,
        parent: TreeNode | None,
        last_access: int,
        key_bytes: bytes | None = None,
    ) -> None:
        self.key = key
        self.key_bytes = key.tokens.tobytes() if key_bytes is None else key_bytes
        self.value = value
        self.num_units = int(value.shape[0])  # key length in units == slots held; kept in sync by the tree
        self.parent = parent
        self.children: dict[Hashable, TreeNode] = {}
        self.lock_ref = 0
        self.last_access = last_access
        self.id = next(_ids)

    @property
    def is_leaf(self) -> bool:
        return not self.children

    @property
    def is_evictable_leaf(self) -> bool:
        """In the tree, unlocked, without children, and not the root."""
        return self.parent is not None and not self.children and self.lock_ref == 0

    def __lt__(self, other: TreeNode) -> bool:
        return (self.last_access, self.id) < (other.last_access, other.id)

    def __repr__(self) -> str:
        return f"TreeNode(id={self.id}, {self.num_units} units, lock_ref={self.lock_ref}, key={self.key!r})"
