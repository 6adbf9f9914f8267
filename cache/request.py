"""A live request as the prefix cache sees it. Owned by the scheduler; the cache's request-level operations
(`admit`, `cache_unfinished_req`, `cache_finished_req`, `release_req`) read and update it.

Units: positions are token positions of the request (0-based); slots are full-attention slot ids.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np

from cache.keys import SLOT_DTYPE


class CachedReq:
    """Per-request cache bookkeeping (SGLang's `Req` fields that the tree touches).

    kv_slots: host mirror of the request's page-table row. `kv_slots[i]` is the full slot holding the KV of
        position i, for every position whose KV is computed (or being computed this step). The scheduler
        appends slots it allocates; `cache_unfinished_req` may replace duplicates by the tree's slots, and the
        caller must then copy the changed range to the device page table. Read as a read-only view of an
        append-only buffer (see "Slot row" below); assigning it replaces the row (a copy).
    prefix_len: SGLang's `len(req.prefix_indices)`: leading positions the request does not recompute. Slots
        `kv_slots[:prefix_len]` are tree-owned except a private tail a chunk leaves behind (EAGLE at P=1: the
        last computed token's slot, whose bigram is not final; P>1: the partial last page).
    last_matched_prefix_len: how many leading slots the tree owns (and the lock covers) after the last
        match/re-match.
    last_node: the deepest node the request's lock covers (the tree's root when nothing is locked).
    lock_id: the id returned by `inc_lock_ref` (SWA trees: the swa_uuid; None otherwise), passed back to
        `dec_lock_ref`.
    extra_key: the namespace of this request's keys (LoRA id / cache salt), or None.

    Slot row: a decoding request gains one slot per step, so the row lives in a buffer that grows
    geometrically; `append_slots` and `truncate_slots` cost O(slots appended) and O(1), never O(context).
    `page_ids(page_size, n)` keeps a second buffer, the int32 page id of every page's first slot, and fills
    only the entries past the last one known to be current: appends leave earlier entries current, a
    truncation keeps the entries whose first slot survives, an assignment of the whole row makes none current.
    An assignment takes a fresh buffer, so views handed out earlier stay intact; only an append after a
    truncation writes over an old view's tail (readers that keep slots past a truncation copy them).
    """

    def __init__(self, last_node: Any, kv_slots: np.ndarray | None = None, prefix_len: int = 0,
                 last_matched_prefix_len: int = 0, lock_id: int | None = None,
                 extra_key: Hashable | None = None) -> None:
        self.last_node = last_node
        self.prefix_len = prefix_len
        self.last_matched_prefix_len = last_matched_prefix_len
        self.lock_id = lock_id
        self.extra_key = extra_key
        self._slots = np.zeros(0, SLOT_DTYPE)
        self._num_slots = 0
        self._pages = np.zeros(0, np.int32)
        self._num_pages_current = 0  # leading entries of `_pages` equal to the row's page ids
        self._page_size = 0  # the page size `_pages` was built for (0: none yet)
        if kv_slots is not None:
            self.kv_slots = kv_slots

    def __repr__(self) -> str:
        return (f"CachedReq(slots={self._num_slots}, prefix_len={self.prefix_len}, "
                f"last_matched_prefix_len={self.last_matched_prefix_len}, lock_id={self.lock_id}, "
                f"extra_key={self.extra_key!r})")

    @property
    def kv_slots(self) -> np.ndarray:
        view = self._slots[: self._num_slots]
        view.flags.writeable = False
        return view

    @kv_slots.setter
    def kv_slots(self, slots: np.ndarray) -> None:
        slots = np.asarray(slots)
        if slots.ndim != 1:
            raise ValueError(f"kv_slots must be one-dimensional, got shape {slots.shape}")
        n = slots.shape[0]
        if n <= self._num_slots and _is_prefix_view(slots, self._slots):
            self.truncate_slots(n)  # `req.kv_slots = req.kv_slots[:n]`: no copy
            return
        self._slots = np.empty(max(n, 16), SLOT_DTYPE)  # a fresh buffer: views handed out stay intact
        self._slots[:n] = slots
        self._num_slots = n
        self._num_pages_current = 0

    def append_slots(self, slots: np.ndarray) -> None:
        """Append `slots` (the next positions' slots) to the row: amortised O(len(slots))."""
        n = self._num_slots + slots.shape[0]
        if n > self._slots.shape[0]:
            grown = np.empty(max(n, 2 * self._slots.shape[0], 16), SLOT_DTYPE)
            grown[: self._num_slots] = self._slots[: self._num_slots]
            self._slots = grown
        self._slots[self._num_slots: n] = slots
        self._num_slots = n

    def truncate_slots(self, num_slots: int) -> None:
        """Keep the row's first `num_slots` slots (at most as many as it holds): O(1)."""
        if not 0 <= num_slots <= self._num_slots:
            raise ValueError(f"truncate to {num_slots} slots of {self._num_slots}")
        self._num_slots = num_slots
        if self._page_size:
            self._num_pages_current = min(self._num_pages_current, -(-num_slots // self._page_size))

    def page_ids(self, page_size: int, num_tokens: int) -> np.ndarray:
        """Read-only int32 view: the page id (`slot // page_size`) of the first slot of every page covering
        positions `[0, num_tokens)`, or of every page the row holds if it holds fewer. Fills only the
        entries not current yet (O(new pages) for a decoding request)."""
        if page_size != self._page_size:
            self._page_size, self._num_pages_current = page_size, 0
        held = -(-self._num_slots // page_size)
        if held > self._pages.shape[0]:
            grown = np.empty(max(held, 2 * self._pages.shape[0], 16), np.int32)
            grown[: self._num_pages_current] = self._pages[: self._num_pages_current]
            self._pages = grown
        lo = self._num_pages_current
        if held > lo:
            firsts = self._slots[lo * page_size: self._num_slots: page_size]
            self._pages[lo: held] = firsts // page_size if page_size > 1 else firsts
            self._num_pages_current = held
        view = self._pages[: min(held, -(-num_tokens // page_size))]
        view.flags.writeable = False
        return view


def _is_prefix_view(a: np.ndarray, buf: np.ndarray) -> bool:
    """Is `a` a contiguous view of `buf` starting at its first element (what slicing `kv_slots[:n]` gives)?"""
    if a.dtype != buf.dtype or (a.shape[0] > 1 and a.strides[0] != buf.strides[0]):
        return False
    if a.shape[0] == 0:  # an empty array says nothing of where it came from: take a fresh buffer
        return False
    return a.__array_interface__["data"][0] == buf.__array_interface__["data"][0]
