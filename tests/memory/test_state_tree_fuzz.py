"""Old allocator states under arbitrary branching: every op may start from any state ever created.

Oracle: each state carries its own free set (a plain Python set, computed from its parent's). The
implementation may refuse a state as stale only if some free happened anywhere after that state was
created; whenever it accepts a state, everything it answers must agree with that state's own free set
(allocations take only free pages, frees of owned pages succeed, frees of free pages are double frees).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxserve.memory import allocator as A
from jaxserve.memory import swa_allocator as S
from jaxserve.memory.errors import DoubleFreeError, OutOfSlots, StaleAllocatorStateError


def _slots(pages, p: int) -> np.ndarray:
    return (np.asarray(sorted(pages), dtype=np.int64)[:, None] * p + np.arange(p)).reshape(-1)


@settings(max_examples=80, deadline=None)
@given(num_pages=st.integers(1, 10), page_size=st.sampled_from([1, 3]), data=st.data())
def test_any_state_is_either_refused_as_stale_or_exact(num_pages: int, page_size: int, data) -> None:
    p = page_size
    everything = set(range(1, num_pages + 1))
    states = [(A.make_allocator(num_pages, p), set(everything), 0)]  # (state, free pages, frees before it)
    num_frees = 0
    for _ in range(data.draw(st.integers(1, 30))):
        state, free, born = states[data.draw(st.integers(0, len(states) - 1))]
        op = data.draw(st.sampled_from(["alloc", "free", "double", "look"]))
        try:
            if op == "alloc":
                n = data.draw(st.integers(1, 3))
                result = A.alloc_pages(state, n)
                if n > len(free):
                    assert isinstance(result, OutOfSlots)
                    continue
                new_state, pages = result
                assert set(pages.tolist()) <= free and len(set(pages.tolist())) == n
                states.append((new_state, free - set(pages.tolist()), num_frees))
            elif op == "free" and everything - free:
                pages = set(data.draw(st.lists(st.sampled_from(sorted(everything - free)), min_size=1)))
                new_state = A.free(state, _slots(pages, p))
                num_frees += 1
                states.append((new_state, free | pages, num_frees))
            elif op == "double" and free:
                with pytest.raises(DoubleFreeError):
                    A.free(state, _slots([data.draw(st.sampled_from(sorted(free)))], p))
            else:
                assert set((A.free_slot_ids(state)[::p] // p).tolist()) == free
                assert A.available_size(state) == len(free) * p
        except StaleAllocatorStateError:
            assert num_frees > born, "refused a state although nothing was freed after it was created"


@settings(max_examples=60, deadline=None)
@given(num_full=st.integers(1, 8), num_swa=st.integers(1, 8), data=st.data())
def test_any_swa_state_is_either_refused_as_stale_or_exact(num_full: int, num_swa: int, data) -> None:
    start = S.make_swa_allocator(num_full, num_swa, 1)
    # (state, free full, free swa, mapping full->swa of allocated pages (absent: tombstoned), frees/branches)
    states = [(start, set(range(1, num_full + 1)), set(range(1, num_swa + 1)), {}, 0)]
    events = 0  # frees, and allocations from any state but the newest (they may remap a sibling's pages)
    for _ in range(data.draw(st.integers(1, 25))):
        i = data.draw(st.integers(0, len(states) - 1))
        state, full, swa, mapping, born = states[i]
        owned = sorted(set(range(1, num_full + 1)) - full)
        op = data.draw(st.sampled_from(["alloc", "free", "free_swa", "look"]))
        try:
            if op == "alloc":
                n = data.draw(st.integers(1, 3))
                result = S.alloc(state, n)
                if n > min(len(full), len(swa)):
                    assert isinstance(result, OutOfSlots)
                    continue
                new_state, slots = result
                swa_slots = S.swa_slots_of(new_state, slots)
                assert set(slots.tolist()) <= full and set(swa_slots.tolist()) <= swa
                if i != len(states) - 1:
                    events += 1
                new_map = mapping | dict(zip(slots.tolist(), swa_slots.tolist(), strict=True))
                states.append(
                    (new_state, full - set(slots.tolist()), swa - set(swa_slots.tolist()), new_map, events)
                )
            elif op in ("free", "free_swa") and owned:
                chosen = sorted(set(data.draw(st.lists(st.sampled_from(owned), min_size=1))))
                fn = S.free if op == "free" else S.free_swa
                new_state = fn(state, np.asarray(chosen))
                events += 1
                new_map = {f: s for f, s in mapping.items() if f not in chosen}
                freed_swa = {mapping[f] for f in chosen if f in mapping}
                new_full = full | set(chosen) if op == "free" else set(full)
                states.append((new_state, new_full, swa | freed_swa, new_map, events))
            else:
                assert set(S.free_slot_ids(state).tolist()) == full
                assert set(S.free_swa_slot_ids(state).tolist()) == swa
                if owned:
                    got = S.swa_slots_of(state, np.asarray(owned)).tolist()
                    assert got == [mapping.get(f, 0) for f in owned]
        except StaleAllocatorStateError:
            assert events > born, "refused a state although nothing was freed or branched after it"
