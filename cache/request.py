"""A live request as the prefix cache sees it. Owned by the scheduler; the cache's request-level operations
(`admit`, `cache_unfinished_req`, `cache_finished_req`, `release_req`) read and update it.

Units: positions are token positions of the request (0-based); slots are full-attention slot ids.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cache.keys import SLOT_DTYPE


@dataclass(eq=False)
class CachedReq:
    """Per-request cache bookkeeping (SGLang's `Req` fields that the tree touches).

    kv_slots: host mirror of the request's page-table row. `kv_slots[i]` is the full slot holding the KV of
        position i, for every position whose KV is computed (or being computed this step). The scheduler
        appends slots it allocates; `cache_unfinished_req` may replace duplicates by the tree's slots, and the
        caller must then copy the changed range to the device page table.
    prefix_len: SGLang's `len(req.prefix_indices)`: leading positions the request does not recompute. Slots
        `kv_slots[:prefix_len]` are tree-owned except a private tail a chunk leaves behind (EAGLE at P=1: the
        last computed token's slot, whose bigram is not final; P>1: the partial last page).
    last_matched_prefix_len: how many leading slots the tree owns (and the lock covers) after the last
        match/re-match.
    last_node: the deepest node the request's lock covers (the tree's root when nothing is locked).
    lock_id: the id returned by `inc_lock_ref` (SWA trees: the swa_uuid; None otherwise), passed back to
        `dec_lock_ref`.
    extra_key: the namespace of this request's keys (LoRA id / cache salt), or None.
    """

    last_node: Any
    kv_slots: np.ndarray = field(default_factory=lambda: np.zeros(0, SLOT_DTYPE))
    prefix_len: int = 0
    last_matched_prefix_len: int = 0
    lock_id: int | None = None
    extra_key: Hashable | None = None
