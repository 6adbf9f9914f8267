"""EAGLE-3 draft vocabulary: the `d2t` / `t2d` tensors of the SpecForge/EAGLE checkpoint format.

The draft's LM head covers only the `draft_vocab_size` target tokens that were most frequent in its training
data. `d2t[i]` (int64, one per draft id) is an offset: target id = i + d2t[i]. `t2d[v]` (bool, one per
target id) says whether target token v is in the draft vocabulary. The chosen ids are sorted ascending, so
draft id order follows target id order.
"""

from __future__ import annotations

import numpy as np


def build_vocab_map(token_counts: np.ndarray, draft_vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """`token_counts [target_vocab]` -> `(d2t int64 [draft_vocab_size], t2d bool [target_vocab])` for the
    `draft_vocab_size` most frequent ids (ties: the lower id first)."""
    counts = np.asarray(token_counts)
    target_vocab = counts.shape[0]
    if not 0 < draft_vocab_size <= target_vocab:
        raise ValueError(f"draft_vocab_size={draft_vocab_size} must be in [1, target vocab {target_vocab}]")
    order = np.lexsort((np.arange(target_vocab), -counts))  # by count descending, then id ascending
    used = np.sort(order[:draft_vocab_size])
    d2t = (used - np.arange(draft_vocab_size)).astype(np.int64)
    t2d = np.zeros(target_vocab, bool)
    t2d[used] = True
    return d2t, t2d


def draft_to_target_ids(d2t: np.ndarray) -> np.ndarray:
    """`[draft_vocab]` target id of each draft id (SGLang's `hot_token_id`)."""
    return np.arange(d2t.shape[0]) + np.asarray(d2t)


def check_vocab_map(d2t: np.ndarray, t2d: np.ndarray) -> None:
    """ValueError unless `d2t` maps draft ids to distinct, ascending target ids that are exactly `t2d`'s."""
    target_ids = draft_to_target_ids(d2t)
    if target_ids.size and (target_ids.min() < 0 or target_ids.max() >= t2d.shape[0]):
        raise ValueError(f"d2t maps draft ids outside the target vocabulary [0, {t2d.shape[0]})")
    if np.any(np.diff(target_ids) <= 0):
        raise ValueError("d2t must map draft ids to strictly increasing target ids")
    if not np.array_equal(np.flatnonzero(t2d), target_ids):
        raise ValueError("t2d does not mark exactly the target ids that d2t maps to")
