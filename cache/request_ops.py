"""Request-level operations both trees share: admission, chunked prefill, finish, release.

Ownership model of a live `CachedReq` (see `cache.request`): with `L = req.last_matched_prefix_len`,
`kv_slots[:L]` are the tree's slots on the locked path of `req.last_node`, and `kv_slots[L:]` are the
request's own (private). `L` is always a multiple of the page size, so every private page is the request's
alone. The trees differ only in how a request's computed prefix goes into the tree and who frees the
request's duplicates of units the tree already had: that is the hook `_insert_req_prefix`, implemented by
`cache.radix_requests.RadixRequestOps` and `cache.swa_requests.SWARequestOps` (see there for each tree's
rules and where they are correct and SGLang 0.5.3.post1 is not).

The host class provides `eagle`, `page_size`, `disabled`, `root`, `allocator`, `_match` / `_insert` (match
and insert of a prepared key: a `RadixKey` plus its tokens' bytes), `inc_lock_ref`, `dec_lock_ref` and
`_unlock_path` (`dec_lock_ref` on a root path already checked). Each operation validates and copies the
request's tokens once (`cache.keys.token_array_and_bytes`) and hands the prepared key to every tree call it
makes.

A finishing or chunked request's insert starts where its lock ends: while a request is live its locked path
cannot be evicted (splits only add nodes to it), so once its keys are checked against the request's tokens
(one memcmp per node, `_admission_path`) the insert stamps those nodes as a walk from the root would and
walks on from `req.last_node`. The tree's slots for those units are neither stored nor freed, so only the
request's private slots are validated. When the check fails (the caller passed other tokens) the insert
walks from the root as before.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cache.errors import InvariantError, RequestStateError
from cache.keys import SLOT_DTYPE, RadixKey, token_array_and_bytes
from cache.node_base import _TOKEN_BYTES
from cache.request import CachedReq


class RequestOps:
    """Mixin base: the scheduler-facing operations on a `CachedReq`, around the hook `_insert_req_prefix`."""

    def _insert_req_prefix(
        self, key: RadixKey, token_bytes: bytes, kv: np.ndarray, owned: int, path: list | None
    ) -> tuple[np.ndarray, int]:
        """Insert `key` (whole pages, `num_units = len(kv)` units, `owned <= num_units`; `token_bytes` are its
        tokens' bytes) with the request's slots `kv`, of which `kv[:owned]` are already the tree's. `path`
        is `_admission_path`'s answer (None: walk from the root). Returns the request's duplicate slots that
        the caller must still free (whole pages of `kv[owned:]`), and the end of the range `[owned, end)` of
        `kv` whose slots the tree may have replaced by its own."""
        raise NotImplementedError

    def _match_and_lock(self, key: RadixKey, token_bytes: bytes) -> tuple[np.ndarray, object, int | None]:
        """`_match` then `inc_lock_ref` of the matched node: (slots, node, lock id). A tree may fuse them."""
        slots, node = self._match(key, token_bytes)
        return slots, node, self.inc_lock_ref(node)

    def _admission_path(self, req: CachedReq, token_bytes: bytes) -> list | None:
        """The nodes from the root's child down to `req.last_node` if their keys are exactly the first
        `req.last_matched_prefix_len` units of the tokens whose bytes are `token_bytes` (at least that many
        units), in the request's namespace; else None. An empty list when the request holds no match.
        Changes nothing. Cost: O(depth) Python steps, one memcmp per node."""
        node = req.last_node
        path = node.path_from_root()
        if not path:
            return path if node is self.root and not req.last_matched_prefix_len else None
        if path[0].parent is not self.root or path[0].key.extra_key != req.extra_key:
            return None
        start = 0
        for n in path:
            if not token_bytes.startswith(n.key_bytes, start):
                return None
            start += n.num_units * _TOKEN_BYTES
        return path if start == req.last_matched_prefix_len * _TOKEN_BYTES else None

    def _kv_prefix_units(self, num_tokens: int) -> int:
        """Units of a request with `num_tokens` computed tokens that can go into the tree: R1 (EAGLE keeps the
        last token's KV out: its bigram partner is unknown) then R2 (whole pages)."""
        num_units = max(num_tokens - self.eagle, 0)
        return num_units - num_units % self.page_size

    def admit(self, req: CachedReq, fill_ids: Sequence[int] | np.ndarray) -> int:
        """Match `fill_ids[:-1]` (at least one token is always recomputed, so the step has a position to
        sample from), lock the match (the lock id goes to `req.lock_id`), and set `req.kv_slots` to the
        matched (tree-owned) slots. Returns the matched length (units = slots; under EAGLE at most
        `len(fill_ids) - 2`).

        The caller then allocates slots for the positions from `req.prefix_len` on and appends them to
        `req.kv_slots` (they are the request's). Raises RequestStateError if `req` already holds slots.
        """
        tokens, token_bytes = token_array_and_bytes(fill_ids)
        if req.kv_slots.shape[0] or req.last_matched_prefix_len:
            raise RequestStateError("admit needs a fresh request (no slots); release or finish it first")
        num_tokens = max(tokens.shape[0] - 1, 0)
        key = RadixKey(tokens[:num_tokens], self.eagle, req.extra_key)
        slots, node, req.lock_id = self._match_and_lock(key, token_bytes[: num_tokens * _TOKEN_BYTES])
        req.kv_slots, req.last_node = slots, node
        req.prefix_len = req.last_matched_prefix_len = int(slots.shape[0])
        return req.prefix_len

    def _check_progress(self, req: CachedReq, num_tokens: int, what: str) -> None:
        if num_tokens < req.prefix_len or req.kv_slots.shape[0] < num_tokens:
            raise RequestStateError(
                f"{what}: {num_tokens} tokens with KV, but the request already covers {req.prefix_len} "
                f"and holds {req.kv_slots.shape[0]} slots"
            )

    def cache_unfinished_req(self, req: CachedReq, fill_ids: Sequence[int] | np.ndarray) -> tuple[int, int]:
        """After a prefill chunk: cache what is now computed (`fill_ids`, whose KV is in `req.kv_slots`).

        Inserts the first `page_floor(len - eagle)` units, frees the request's duplicates of units the tree
        already had (whole pages; the SWA tree also revives tombstones), re-matches, points `req.kv_slots`
        at the tree's slots there and moves the lock down to the new match. Returns `[start, stop)`: the
        positions of `req.kv_slots` whose slot may have changed (the caller copies them to the device page
        table; empty when start == stop). `req.prefix_len` becomes `len(fill_ids)`: the next chunk starts
        there. The slots beyond the inserted units (a partial page; under EAGLE the last token's) stay the
        request's. The insert and re-match run even when no new whole page was computed, so the request's
        path becomes the most recently used, as in SGLang.
        """
        tokens, token_bytes = token_array_and_bytes(fill_ids)
        num_tokens = tokens.shape[0]
        self._check_progress(req, num_tokens, "cache_unfinished_req")
        owned = req.last_matched_prefix_len
        num_units = self._kv_prefix_units(num_tokens)
        if self.disabled or num_units < owned:  # fewer units than matched: nothing computed since the match
            req.prefix_len = num_tokens
            return owned, owned
        kv = req.kv_slots
        key = RadixKey(tokens[: num_units + self.eagle], self.eagle, req.extra_key)
        key_bytes = token_bytes[: (num_units + self.eagle) * _TOKEN_BYTES]
        path = self._admission_path(req, key_bytes)
        duplicates, changed_stop = self._insert_req_prefix(key, key_bytes, kv[:num_units], owned, path)
        if duplicates.shape[0]:
            self.allocator.free(duplicates)
        slots, node = self._match(key, key_bytes)
        if slots.shape[0] != num_units:  # cannot happen unless the tree is corrupt; never repoint on it
            raise InvariantError(f"re-match after insert found {slots.shape[0]} of {num_units} units (a bug)")
        lock_id = self.inc_lock_ref(node)
        self.dec_lock_ref(req.last_node, req.lock_id)
        req.kv_slots = np.concatenate((slots, kv[num_units:]))
        req.last_node, req.lock_id = node, lock_id
        req.last_matched_prefix_len, req.prefix_len = num_units, num_tokens
        return owned, changed_stop

    def cache_finished_req(self, req: CachedReq, token_ids: Sequence[int] | np.ndarray) -> None:
        """A finished request: `token_ids` = prompt + output; every token but the last sampled one has KV in
        `req.kv_slots`. Inserts `page_floor(len - 1 - eagle)` units, frees the request's duplicates and every
        private slot the tree did not keep (the tail, including any slots beyond the KV), unlocks, and leaves
        `req` empty. Afterwards the request owns nothing. The insert runs even when it adds no page, so the
        request's path becomes the most recently used, as in SGLang. Disabled tree: frees all its private
        slots.
        """
        tokens, token_bytes = token_array_and_bytes(token_ids)
        num_tokens = max(tokens.shape[0] - 1, 0)
        self._check_progress(req, num_tokens, "cache_finished_req")
        owned, kv = req.last_matched_prefix_len, req.kv_slots
        num_units = self._kv_prefix_units(num_tokens)
        path = None
        if not self.disabled and num_units >= owned:  # also with no new page: the insert refreshes the LRU
            key = RadixKey(tokens[: num_units + self.eagle], self.eagle, req.extra_key)
            key_bytes = token_bytes[: (num_units + self.eagle) * _TOKEN_BYTES]
            path = self._admission_path(req, key_bytes)
            duplicates, _ = self._insert_req_prefix(key, key_bytes, kv[:num_units], owned, path)
            private = np.concatenate((duplicates, kv[num_units:])) if duplicates.shape[0] else kv[num_units:]
        else:
            private = kv[owned:]
        self._free_and_forget(req, private, path)

    def release_req(self, req: CachedReq) -> None:
        """Abort / retract: free the request's private slots, keep what the tree owns, unlock, empty `req`."""
        self._free_and_forget(req, req.kv_slots[req.last_matched_prefix_len :])

    def _free_and_forget(self, req: CachedReq, private: np.ndarray, path: list | None = None) -> None:
        """Unlock `req` (through `path`, its checked root path, when given), free `private`, empty `req`."""
        if path is None or self.disabled:
            self.dec_lock_ref(req.last_node, req.lock_id)
        else:
            self._unlock_path(path, req.last_node, req.lock_id)
        if private.shape[0]:
            self.allocator.free(private)
        req.kv_slots = np.zeros(0, SLOT_DTYPE)
        req.prefix_len = req.last_matched_prefix_len = 0
        req.last_node, req.lock_id = self.root, None
