"""A node of the hybrid (full + sliding-window) prefix tree `cache.swa_radix_cache.SWARadixCache`.

Units: the key has `n` units (tokens, or EAGLE bigrams) and `value` holds exactly `n` *full-attention* slot
ids, unit `i` -> `value[i]`; with `page_size > 1`, `n` is a multiple of the page size and `value` is whole,
ordered pages. The sliding-window (SWA) KV of those positions lives in the SWA slots the allocator maps
behind `value`, unless the node is a *tombstone*: then its SWA KV was freed and the mapping is 0, while the
full KV is kept.

Invariants between calls (proved by `SWARadixCache.check_invariants`):
- S1 `full_lock_ref >= swa_lock_ref >= 0`; S5 a tombstone has `swa_lock_ref == 0`;
- S2 every non-root node is in the full LRU list; S3 it is in the SWA LRU list iff it is not a tombstone;
- S4 a leaf is never a tombstone;
- S7 a live node's slots map to SWA slots, a tombstone's map to 0.
A node removed from the tree has `parent is None` and is not the root: it must not be used again.
`child_key`, `path_from_root`, `path_below` and `iter_below` are shared with the plain tree's node
(`cache.node_base`).
"""

from __future__ import annotations

from collections.abc import Hashable
from itertools import count

import numpy as np

from cache.keys import RadixKey
from cache.lru_list import LRULink
from cache.node_base import NodeBase

_ids = count()


class SWANode(NodeBase):
    """One edge of the SWA tree: key units, full slots, tombstone flag, two lock counts, two LRU links."""

    __slots__ = (
        "children",
        "full_link",
        "full_lock_ref",
        "id",
        "key",
        "key_bytes",
        "num_units",
        "parent",
        "swa_link",
        "swa_lock_ref",
        "swa_uuid",
        "tombstone",
        "value",
    )

    def __init__(
        self, key: RadixKey, value: np.ndarray, parent: SWANode | None, tombstone: bool = False
    ) -> None:
        self.key = key
        self.key_bytes = key.tokens.tobytes()  # cached so that a key comparison is one memcmp
        self.value = value
        self.num_units = int(value.shape[0])  # key units == full slots held; kept in sync by the tree
        self.parent = parent
        self.children: dict[Hashable, SWANode] = {}
        self.tombstone = tombstone
        self.full_lock_ref = 0
        self.swa_lock_ref = 0
        # Set on the node where an `inc_lock_ref` walk's SWA coverage reached the window; an unlock
        # SWA-unlocks from its start up to the node carrying the uuid it was given.
        self.swa_uuid: int | None = None
        self.full_link = LRULink(self)
        self.swa_link = LRULink(self)
        self.id = next(_ids)

    def __repr__(self) -> str:
        flags = " T" if self.tombstone else ""
        uuid = f" uuid={self.swa_uuid}" if self.swa_uuid is not None else ""
        return (
            f"SWANode(id={self.id}, {self.num_units} units, tokens={self.key.tokens[:8].tolist()}"
            f"{'...' if self.key.tokens.shape[0] > 8 else ''}, full_lock={self.full_lock_ref}, "
            f"swa_lock={self.swa_lock_ref}{uuid}{flags})"
        )
