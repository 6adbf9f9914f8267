"""How much a prefix tree must evict before an allocation: what the allocator is short of, no more."""

from __future__ import annotations

from typing import Any


def evict_shortfall(tree: Any, allocator: Any, num_slots: int, *, hybrid: bool) -> None:
    """Evict from `tree` what `allocator` is short of `num_slots` free slots (`hybrid`: on each of the full
    and sliding-window sides: `tree.evict(full, swa)`; else `tree.evict(slots)`). Nothing when it has
    enough. Duck-typed on `available_size` / `full_available_size` / `swa_available_size`, so the
    benchmarks drive SGLang's own trees and allocators through the same rule as ours."""
    if hybrid:
        full_short = num_slots - allocator.full_available_size()
        swa_short = num_slots - allocator.swa_available_size()
        if full_short > 0 or swa_short > 0:
            tree.evict(max(full_short, 0), max(swa_short, 0))
    elif (short := num_slots - allocator.available_size()) > 0:
        tree.evict(short)
