"""The host's grammar walk along a drafted chain or tree: per verify position the bitmask of the grammar
state there, and which drafts stay inside the grammar (`walk_drafts` for chains, `walk_tree` for trees).

A constrained request's round verifies the chain `[x, d1 .. dS]` (x its last output token, already consumed
by its matcher). Node j's logits choose the token after d_j, so node j is masked by the grammar state after
consuming d1 .. dj. The walk fills node 0's mask, then for j = 1 .. S: if the mask allows d_j it consumes
it and fills node j's mask; if the mask allows exactly one token (the grammar forces it) that token replaces
d_j - it is the only token the target may emit there, so it is always accepted; otherwise the chain is cut:
its depth is j - 1 and no later node is verified. A grammar that has ended also cuts the chain (nothing can
follow its end). The matcher is then rolled back to where it started: the engine advances it over the
tokens the round actually emits, as a plain step would.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from jaxserve.memory.host_buffers import aligned_full
from jaxserve.sampling.grammar import GrammarState

_ALL = np.uint32(0xFFFFFFFF)


def _allows(mask_row: np.ndarray, token: int) -> bool:
    return bool((int(mask_row[token >> 5]) >> (token & 31)) & 1)


def _forced(mask_row: np.ndarray) -> int | None:
    """The one token `mask_row` allows, or None when it allows none or several."""
    nonzero = np.flatnonzero(mask_row)
    if nonzero.shape[0] != 1:
        return None
    word = int(mask_row[nonzero[0]])
    if word & (word - 1):
        return None
    return int(nonzero[0]) * 32 + word.bit_length() - 1


def walk_drafts(matchers: Sequence[GrammarState | None], drafts: np.ndarray,
                num_words: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Walk each request's grammar along its drafts (see the module docstring).

    matchers: per request its grammar state (None: unconstrained). drafts `i32[R, S]`: request r's drafts
    d1 .. dS (R >= len(matchers); rows past them are padding). num_words: the bitmask's width W.
    Returns (tokens `i32[R, S]`: the drafts, forced tokens substituted; depth `i32[R]`: drafts each chain
    keeps, S for unconstrained and padding rows; bitmask `u32[R * (S + 1), W]`: node j of request r at row
    r * (S + 1) + j, all ones where unconstrained or past the cut). Every matcher ends as it started.
    """
    rows, steps = drafts.shape
    nodes = steps + 1
    tokens = np.array(drafts, np.int32)
    depth = np.full(rows, steps, np.int32)
    bitmask = aligned_full((rows * nodes, num_words), _ALL, np.uint32)
    for r, matcher in enumerate(matchers):
        if matcher is None:
            continue
        consumed = 0
        matcher.fill(bitmask, r * nodes)
        for j in range(steps):
            row = bitmask[r * nodes + j]
            token = int(tokens[r, j])
            if matcher.stopped or not _allows(row, token):
                forced = None if matcher.stopped else _forced(row)
                if forced is None:
                    break
                tokens[r, j] = token = forced
            matcher.advance(token)
            consumed += 1
            matcher.fill(bitmask, r * nodes + j + 1)
        depth[r] = consumed
        matcher.rollback(consumed)
    return tokens, depth, bitmask


def walk_tree(matchers: Sequence[GrammarState | None], tokens: np.ndarray, parents: np.ndarray,
              children: np.ndarray, num_words: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The walk for draft trees: every node's mask is the grammar state after its path from the root. A node
    whose token its parent's state refuses takes the token that state forces, if it forces one; else (or
    when a kept sibling already carries that token: siblings keep distinct tokens, or when the parent's
    grammar has ended) it is cut with its subtree.

    tokens `i32[R, N]`, parents `i32[R, N]` (-1 the root, < -1 padding; a parent precedes its children),
    children `i32[R, N, K]` (-1 none), as `draft_tree.select_tree` gives them. Returns (tokens with forced
    ones substituted, children with the cut nodes removed, bitmask `u32[R * N, W]`: node v of request r at
    row r * N + v, all ones where unconstrained, cut or padding). Every matcher ends as it started.
    """
    rows, nodes = tokens.shape
    tokens = np.array(tokens, np.int32)
    children = np.array(children, np.int32)
    bitmask = aligned_full((rows * nodes, num_words), _ALL, np.uint32)
    for r, matcher in enumerate(matchers):
        if matcher is None:
            continue
        kept = np.zeros(nodes, bool)
        ended = np.zeros(nodes, bool)
        kept[0], ended[0] = True, matcher.stopped
        matcher.fill(bitmask, r * nodes)
        for v in range(1, nodes):
            p = int(parents[r, v])
            if p < 0 or not kept[p] or ended[p]:
                continue
            parent_mask = bitmask[r * nodes + p]
            if not _allows(parent_mask, int(tokens[r, v])):
                forced = _forced(parent_mask)
                if forced is None:
                    continue
                tokens[r, v] = forced
            siblings = (parents[r, :v] == p) & kept[:v]
            if (tokens[r, :v][siblings] == tokens[r, v]).any():
                continue
            path = []
            u = v
            while u > 0:
                path.append(int(tokens[r, u]))
                u = int(parents[r, u])
            for token in reversed(path):
                matcher.advance(token)
            kept[v], ended[v] = True, matcher.stopped
            matcher.fill(bitmask, r * nodes + v)
            matcher.rollback(len(path))
        cut = (children[r] >= 0) & ~kept[np.maximum(children[r], 0)]
        children[r][cut] = -1
    return tokens, children, bitmask
