"""`cache/README.md` "Appendix A", full-tree rows, reproduced number for number (SGLang 0.5.3.post1 on CPU).

Nine requests "sentence[:k] + xxx" (k = 1..9), each admitted, prefilled, decoded to outputs [900, 901, 902]
and finished in turn, on a 256-slot pool; then a chunked-prefill run (chunk = 3) of a 12-token prompt.
"""

from __future__ import annotations

import pytest

from tests.cache.radix_sim import admit, decode, extend_slots, finish, make_cache, run_request

SENTENCE = list(range(100, 109))  # You are a helpful , respectful and honest assistant
XXX = 109
OUTPUTS = [900, 901, 902]

# (page_size, eagle) -> admits, match(full sentence), admission match of the sentence, stats, invariants
EXPECTED = {
    (1, False): (
        [0, 1, 2, 3, 4, 5, 6, 7, 8], 9, 8,
        {"evictable": 36, "protected": 0, "available": 220, "tree_tokens": 36},
        {"free": 220, "tree": 36, "live_only": 0},
    ),
    (1, True): (
        [0, 0, 1, 2, 3, 4, 5, 6, 7], 8, 7,
        {"evictable": 35, "protected": 0, "available": 221, "tree_tokens": 35},
        {"free": 221, "tree": 35, "live_only": 0},
    ),
    (4, False): (
        [0, 0, 0, 0, 4, 4, 4, 4, 8], 8, 8,
        {"evictable": 36, "protected": 0, "available": 220, "tree_tokens": 36},
        {"free_pages": 55, "tree_pages": 9, "live_only_pages": 0},
    ),
    (4, True): (
        [0, 0, 0, 0, 0, 4, 4, 4, 4], 8, 4,
        {"evictable": 32, "protected": 0, "available": 224, "tree_tokens": 32},
        {"free_pages": 56, "tree_pages": 8, "live_only_pages": 0},
    ),
}  # fmt: skip


@pytest.mark.parametrize(("page_size", "eagle"), list(EXPECTED))
def test_appendix_a_prefix_tree_prompts(page_size: int, eagle: bool) -> None:
    admits_want, match_full_want, admission_want, stats_want, inv_want = EXPECTED[page_size, eagle]
    cache, alloc = make_cache(256, page_size, eagle)
    admits = []
    for k in range(1, 10):
        admits.append(run_request(cache, [*SENTENCE[:k], XXX], OUTPUTS))
        cache.check_invariants()
    assert admits == admits_want
    assert len(cache.match_prefix(SENTENCE).slots) == match_full_want
    assert len(cache.match_prefix(SENTENCE[:-1]).slots) == admission_want  # admission matches fill_ids[:-1]
    stats = {
        "evictable": cache.evictable_size,
        "protected": cache.protected_size,
        "available": alloc.available_size(),
        "tree_tokens": cache.total_size(),
    }
    assert stats == stats_want
    assert cache.check_invariants() == inv_want


CHUNKED_EXPECTED = {
    (1, False): (11, {"free": 242, "tree": 14, "live_only": 0}),
    (1, True): (10, {"free": 243, "tree": 13, "live_only": 0}),
    (4, False): (8, {"free_pages": 61, "tree_pages": 3, "live_only_pages": 0}),
    (4, True): (8, {"free_pages": 61, "tree_pages": 3, "live_only_pages": 0}),
}


@pytest.mark.parametrize(("page_size", "eagle"), list(CHUNKED_EXPECTED))
def test_appendix_a_chunked_prefill(page_size: int, eagle: bool) -> None:
    second_want, inv_want = CHUNKED_EXPECTED[page_size, eagle]
    cache, _ = make_cache(256, page_size, eagle)
    prompt = list(range(200, 212))
    first = admit(cache, prompt)
    assert first.admitted == 0
    for stop in (3, 6, 9, 12):
        assert cache.check_invariants(live_reqs=[first.req])

        assert extend_slots(cache, first.req, stop - first.num_with_kv)
        cache.cache_unfinished_req(first.req, prompt[:stop])

    for tok in OUTPUTS:
        assert decode(cache, first, tok)
    finish(cache, first)
    second = admit(cache, prompt)
    assert second.admitted == second_want
    assert cache.check_invariants(live_reqs=[second.req]) == inv_want
    cache.release_req(second.req)
    assert cache.protected_size == 0
