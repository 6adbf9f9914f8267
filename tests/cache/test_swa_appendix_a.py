"""`cache/README.md` "Appendix A", SWA rows, number for number (SGLang 0.5.3.post1 run on CPU).

Scenario: 9 prompts "You", "You are", ... (tokens 100..108), each followed by "xxx" (109), each decoded to
the output [900, 901, 902] and finished, one after the other. Pools: 256 full slots and 128 SWA slots (the
doc's available + tree counts: 220 + 36 = 256, 92 + 36 = 128). The window does not matter without
tombstones; the tombstone runs use W = 2 and 8 as printed.
"""

from __future__ import annotations

import numpy as np
import pytest

from cache import CachedReq
from tests.cache.swa_sim import (
    OUTPUT,
    WORDS,
    make_swa,
    run_request,
    serve_and_touch_long_prompt,
    serve_nine_prompts,
)

# (page_size, eagle) -> admits, match(full sentence), admission match of the full-sentence prompt, tree units
BUILD_ROWS = {
    (1, False): ([0, 1, 2, 3, 4, 5, 6, 7, 8], 9, 8, 36),
    (1, True): ([0, 0, 1, 2, 3, 4, 5, 6, 7], 8, 7, 35),
    (4, False): ([0, 0, 0, 0, 4, 4, 4, 4, 8], 8, 8, 36),
    (4, True): ([0, 0, 0, 0, 0, 4, 4, 4, 4], 8, 4, 32),
}


@pytest.mark.parametrize(("page_size", "eagle"), sorted(BUILD_ROWS))
def test_nine_prompt_tree_matches_sglang_numbers(page_size: int, eagle: bool) -> None:
    admits_ref, full_match_ref, admit_full_ref, tree_units = BUILD_ROWS[page_size, eagle]
    tree, alloc = make_swa(256, 128, window=4, page_size=page_size, eagle=eagle)
    admits = serve_nine_prompts(tree)
    assert admits == admits_ref
    assert tree.match_prefix(WORDS).slots.shape[0] == full_match_ref
    req = CachedReq(last_node=tree.root)
    assert tree.admit(req, WORDS) == admit_full_ref
    tree.release_req(req)
    stats = {
        "full_evictable": tree.full_evictable_size,
        "swa_evictable": tree.swa_evictable_size,
        "full_protected": tree.full_protected_size,
        "swa_protected": tree.swa_protected_size,
        "full_available": alloc.full_available_size(),
        "swa_available": alloc.swa_available_size(),
        "tree_full_tokens": tree.total_size(),
        "tree_swa_tokens": tree.total_swa_size(),
    }
    assert stats == {
        "full_evictable": tree_units,
        "swa_evictable": tree_units,
        "full_protected": 0,
        "swa_protected": 0,
        "full_available": 256 - tree_units,
        "swa_available": 128 - tree_units,
        "tree_full_tokens": tree_units,
        "tree_swa_tokens": tree_units,
    }
    inv = tree.check_invariants()
    assert inv == {"free": 256 - tree_units, "tree": tree_units, "live_only": 0, "swa_free": 128 - tree_units}


# (window, eagle) -> tree_full, tree_swa, match(FULL), match(FULL + [1, 2]), match(longp)
TOMBSTONE_ROWS = {
    (2, False): (15, 14, 9, 11, 15),
    (2, True): (14, 13, 8, 10, 14),
    (8, False): (15, 14, 9, 11, 15),
    (8, True): (14, 13, 0, 10, 14),
}


@pytest.mark.parametrize(("window", "eagle"), sorted(TOMBSTONE_ROWS))
def test_tombstone_runs_match_sglang_numbers(window: int, eagle: bool) -> None:
    """Build the tree, serve FULL+[1..6] as one more request, touch it, evict(swa=30): the xxx leaves go,
    plus the leaf [900, 901] split off by the touch (29 SWA slots), then the root-side "You" node becomes
    the only tombstone (30)."""
    tree, _ = make_swa(256, 128, window=window, eagle=eagle)
    serve_nine_prompts(tree)
    longp = serve_and_touch_long_prompt(tree)
    assert tree.evict(0, 30) == (29, 30)
    tombstones = [n for n in tree.iter_nodes() if n.tombstone]
    assert len(tombstones) == 1 and tombstones[0].parent is tree.root
    assert tombstones[0].key.tokens.tolist() == ([100, 101] if eagle else [100])
    tree_full, tree_swa, m_full, m_full12, m_long = TOMBSTONE_ROWS[window, eagle]
    assert (tree.total_size(), tree.total_swa_size()) == (tree_full, tree_swa)
    assert tree.match_prefix(WORDS).slots.shape[0] == m_full
    assert tree.match_prefix([*WORDS, 1, 2]).slots.shape[0] == m_full12
    assert tree.match_prefix(longp).slots.shape[0] == m_long
    tree.check_invariants()


# (page_size, eagle) -> second admit, free, tree, swa_free (a 12-token prompt, chunk = 3)
CHUNK_ROWS = {
    (1, False): (11, 242, 14, 114),
    (1, True): (10, 243, 13, 115),
    (4, False): (8, 244, 12, 116),
    (4, True): (8, 244, 12, 116),
}


@pytest.mark.parametrize(("page_size", "eagle"), sorted(CHUNK_ROWS))
def test_chunked_prefill_runs_match_sglang_numbers(page_size: int, eagle: bool) -> None:
    tree, _ = make_swa(256, 128, window=4, page_size=page_size, eagle=eagle)
    prompt = list(range(300, 312))
    assert run_request(tree, prompt, OUTPUT, chunk=3) == 0
    second_ref, free, tree_units, swa_free = CHUNK_ROWS[page_size, eagle]
    second = CachedReq(last_node=tree.root)
    assert tree.admit(second, prompt) == second_ref
    assert tree.check_invariants([second]) == {
        "free": free,
        "tree": tree_units,
        "live_only": 0,
        "swa_free": swa_free,
    }
    tree.release_req(second)
    assert tree.full_protected_size == tree.swa_protected_size == 0


def test_chunked_eagle_p1_keeps_one_private_slot_per_chunk() -> None:
    """"Chunked prefill" example (P=1, EAGLE, chunk 3, prompt a..g): after each chunk the tree holds len-1
    bigrams, the request privately keeps the last token's slot, and `prefix_len` counts it."""
    tree, alloc = make_swa(64, 64, window=2, eagle=True)
    prompt = list(range(10, 17))
    req = CachedReq(last_node=tree.root)
    assert tree.admit(req, prompt) == 0
    req.kv_slots = alloc.alloc(3)
    s = req.kv_slots.copy()
    assert tree.cache_unfinished_req(req, prompt[:3]) == (0, 2)
    assert (req.last_matched_prefix_len, req.prefix_len) == (2, 3)
    assert np.array_equal(req.kv_slots, s)
    assert tree.check_invariants([req])["live_only"] == 1
    req.kv_slots = np.concatenate([req.kv_slots, alloc.alloc(3)])
    assert tree.cache_unfinished_req(req, prompt[:6]) == (2, 5)
    assert (req.last_matched_prefix_len, req.prefix_len) == (5, 6)
    assert tree.check_invariants([req])["live_only"] == 1
    req.kv_slots = np.concatenate([req.kv_slots, alloc.alloc(1)])
    tree.cache_finished_req(req, [*prompt, 900])
    assert tree.total_size() == 6  # bigrams (a,b)..(f,g)
    assert tree.check_invariants()["live_only"] == 0
