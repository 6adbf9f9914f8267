"""Without tombstones the SWA tree behaves exactly like the plain tree (`cache/README.md`, "Appendix A"):
random inserts and matches give the same inserted-prefix lengths and the same matched lengths as
`RadixCache`, for page sizes 1/4 and EAGLE on/off, whatever the window."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cache import RadixCache, SWARadixCache
from cache.testing import CheckedAllocator, CheckedSWAAllocator

SEQS = st.lists(st.integers(0, 2), min_size=0, max_size=14)
OPS = st.lists(st.tuples(st.sampled_from(["insert", "match"]), SEQS), max_size=25)


@settings(max_examples=60, deadline=None)
@given(ops=OPS, page_size=st.sampled_from([1, 4]), eagle=st.booleans(), window=st.integers(1, 20))
def test_swa_tree_without_tombstones_matches_the_plain_tree(
    ops: list[tuple[str, list[int]]], page_size: int, eagle: bool, window: int
) -> None:
    plain_alloc = CheckedAllocator(512, page_size)
    swa_alloc = CheckedSWAAllocator(512, 512, page_size)
    plain = RadixCache(plain_alloc, page_size=page_size, eagle=eagle)
    swa = SWARadixCache(swa_alloc, sliding_window=window, page_size=page_size, eagle=eagle)
    for op, tokens in ops:
        if op == "match":
            assert plain.match_prefix(tokens).slots.shape[0] == swa.match_prefix(tokens).slots.shape[0]
            continue
        units = max(len(tokens) - eagle, 0)
        units -= units % page_size
        if units == 0:
            continue
        key = tokens[: units + eagle]
        plain_slots = plain_alloc.alloc(units)
        cached = plain.insert(key, plain_slots)
        plain_alloc.free(plain_slots[:cached])  # the plain tree leaves the duplicates to its caller
        assert swa.insert(key, swa_alloc.alloc(units)) == cached  # the SWA tree frees its own
    assert plain.total_size() == swa.total_size() == swa.total_swa_size()
    assert plain.evictable_size == swa.full_evictable_size == swa.swa_evictable_size
    assert plain.check_invariants()["free" if page_size == 1 else "free_pages"] * page_size == (
        swa.check_invariants()["free"]
    )
