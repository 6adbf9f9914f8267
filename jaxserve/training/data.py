"""Token streams and fixed-length training windows (host side, numpy)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from jaxserve.loader.tokenizer import HFTokenizer
from jaxserve.training.corpus import EOS, read_documents


def encode_documents(tokenizer: HFTokenizer, documents: list[str]) -> np.ndarray:
    """One int32 stream: each document's tokens followed by the eos (`<|endoftext|>`) id."""
    eos = tokenizer.token_to_id(EOS)
    ids: list[int] = []
    for doc in documents:
        ids.extend(tokenizer.encode(doc, add_special_tokens=False))
        ids.append(eos)
    return np.asarray(ids, np.int32)


def encode_file(tokenizer: HFTokenizer, path: str | Path) -> np.ndarray:
    return encode_documents(tokenizer, read_documents(path))


def sample_windows(stream: np.ndarray, batch_size: int, length: int, rng: np.random.Generator) -> np.ndarray:
    """`[batch_size, length]` windows starting at uniformly random offsets of `stream`."""
    if stream.size <= length:
        raise ValueError(f"token stream of {stream.size} tokens is too short for windows of {length}")
    starts = rng.integers(0, stream.size - length, size=batch_size)
    return np.stack([stream[s: s + length] for s in starts])


def heldout_windows(stream: np.ndarray, length: int, max_windows: int) -> np.ndarray:
    """Non-overlapping `[n, length]` windows from the start of `stream` (n <= max_windows, >= 1)."""
    n = max(1, min(max_windows, stream.size // length))
    if stream.size < length:
        stream = np.pad(stream, (0, length - stream.size))
    return stream[: n * length].reshape(n, length)


def cosine_lr(step: int, *, peak: float, warmup: int, total: int, floor: float = 0.1) -> float:
    """Linear warm-up to `peak`, then cosine decay to `floor * peak` at `total`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (floor + (1 - floor) * 0.5 * (1 + np.cos(np.pi * frac)))
