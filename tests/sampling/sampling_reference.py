"""Plain numpy reference for jaxserve.sampling, written independently of it (per row, loops, float64).

Top-p is formulated without sorting: a token is kept when the (post-top-k) probability mass of tokens
strictly larger than it is below top_p. That equals "smallest sorted prefix reaching top_p, ties at the last
kept value kept too", the rule documented in jaxserve/sampling/filters.py.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

NEG_INF = -np.inf


def softmax(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values, np.float64)
    finite = values > NEG_INF
    out = np.zeros_like(values)
    if finite.any():
        shifted = np.exp(values[finite] - values[finite].max())
        out[finite] = shifted / shifted.sum()
    return out


def penalise(
    logits: np.ndarray,
    prompt: list[int],
    output: list[int],
    repetition: float,
    frequency: float,
    presence: float,
) -> np.ndarray:
    """One row: repetition penalty over prompt+output tokens, then frequency/presence over output tokens."""
    row = np.array(logits, np.float32)
    for token in set(prompt) | set(output):
        row[token] = (
            row[token] * np.float32(repetition) if row[token] < 0 else row[token] / np.float32(repetition)
        )
    for token, count in Counter(output).items():
        row[token] = row[token] - np.float32(count * frequency) - np.float32(presence)
    return row


def keep_mask(scaled: np.ndarray, top_k: int, top_p: float, min_p: float) -> np.ndarray:
    """One row of temperature-scaled logits -> bool mask of surviving tokens (top-k, top-p, min-p)."""
    scaled = np.asarray(scaled, np.float64)
    vocab_size = scaled.size
    keep = np.ones(vocab_size, bool)
    if 0 < top_k < vocab_size:
        kth_largest = np.sort(scaled)[::-1][top_k - 1]
        keep &= scaled >= kth_largest
    if top_p < 1.0:
        probs = softmax(np.where(keep, scaled, NEG_INF))
        mass_above = np.array([probs[scaled > value].sum() for value in scaled])
        keep &= mass_above < top_p
    if min_p > 0.0:
        probs = softmax(np.where(keep, scaled, NEG_INF))
        keep &= probs >= min_p * probs.max()
    return keep


def mask_margins(scaled: np.ndarray, top_k: int, top_p: float, min_p: float) -> np.ndarray:
    """Per token, how far its top-p / min-p decision is from the threshold (inf where no such decision).

    Float32 device arithmetic may flip a decision within ~1e-6 of the threshold; tests ignore those tokens.
    """
    scaled = np.asarray(scaled, np.float64)
    margin = np.full(scaled.size, np.inf)
    keep = np.ones(scaled.size, bool)
    if 0 < top_k < scaled.size:
        keep &= scaled >= np.sort(scaled)[::-1][top_k - 1]
    if top_p < 1.0:
        probs = softmax(np.where(keep, scaled, NEG_INF))
        mass_above = np.array([probs[scaled > value].sum() for value in scaled])
        margin = np.minimum(margin, np.abs(mass_above - top_p))
        keep &= mass_above < top_p
    if min_p > 0.0:
        probs = softmax(np.where(keep, scaled, NEG_INF))
        with np.errstate(divide="ignore"):
            ratio_margin = np.abs(np.log(probs / probs.max()) - np.log(min_p))
        # The top tokens pass min-p exactly (ratio 1) whatever the rounding.
        margin = np.minimum(margin, np.where(scaled == scaled.max(), np.inf, ratio_margin))
    return margin


def distribution(
    logits: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float
) -> np.ndarray:
    """The probability of each token under temperature + filters (one row, already penalised)."""
    scaled = np.asarray(logits, np.float64) / temperature
    return softmax(np.where(keep_mask(scaled, top_k, top_p, min_p), scaled, NEG_INF))
