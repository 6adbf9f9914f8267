"""Per-request seeds and per-token PRNG keys.

A request's key for its t-th sampled token (t = tokens generated so far, 0 for the first) is
`fold_in(key(seed), t)` with the threefry2x32 implementation, where `key(seed)` holds the seed's 64 bits as
two uint32 words (high, low). It depends on nothing else - not the batch, the row index or the bucket - so a
seeded request yields the same tokens wherever it runs. Requests without a seed take one from a `SeedSource`
when they are admitted; their samples are then reproducible for a given engine seed and arrival order.
"""

from __future__ import annotations

import numpy as np

from jaxserve.sampling.params import SamplingParams

_MASK64 = (1 << 64) - 1


def seed_words(seeds: list[int] | tuple[int, ...]) -> np.ndarray:
    """uint32[len(seeds), 2]: each seed's low 64 bits (two's complement) as (high, low) words."""
    masked = [seed & _MASK64 for seed in seeds]
    words = np.zeros((len(masked), 2), dtype=np.uint32)
    words[:, 0] = [seed >> 32 for seed in masked]
    words[:, 1] = [seed & 0xFFFFFFFF for seed in masked]
    return words


def _splitmix64(value: int) -> int:
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


class SeedSource:
    """Hands out distinct, well-mixed 64-bit seeds to requests that did not bring one.

    One per engine. The i-th call of `next_seed` returns splitmix64(base_seed + i), so a run is repeatable
    for a fixed `base_seed` and arrival order.
    """

    def __init__(self, base_seed: int = 0) -> None:
        self._base_seed = base_seed & _MASK64
        self._counter = 0

    def next_seed(self) -> int:
        """A fresh seed in [0, 2**64); advances the counter."""
        seed = _splitmix64((self._base_seed + self._counter) & _MASK64)
        self._counter += 1
        return seed

    def seed_for(self, params: SamplingParams) -> int:
        """The request's own seed if it set one, else the next seed from the counter."""
        return params.seed if params.seed is not None else self.next_seed()
