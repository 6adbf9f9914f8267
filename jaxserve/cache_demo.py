"""The seed scenario of issue #2 played through the host-side prefix trees (no model, no JAX).

Nine growing prompts "You xxx", "You are xxx", ..., "You are a helpful, respectful and honest assistant xxx"
each generate 3 tokens, then the full sentence arrives. With token keys a cached position i may be reused by a
request whose token i+1 differs, which is wrong for EAGLE's draft KV (it depends on token i+1); bigram keys
refuse exactly those positions. The demo prints, per tree, how many prompt tokens each request reuses and how
many of the reused positions carry draft KV computed with a different next token.
"""

from __future__ import annotations

import numpy as np

from cache import CachedReq, RadixCache, SWARadixCache
from cache.testing import CheckedAllocator, CheckedSWAAllocator

WORDS = ["You", "are", "a", "helpful", ",", "respectful", "and", "honest", "assistant"]
VOCAB = {w: 100 + i for i, w in enumerate(WORDS)} | {"xxx": 109, ".": 110}
OUTPUT = [900, 901, 902]


def seed_prompts() -> list[list[int]]:
    """The nine prefix prompts (k words + "xxx") and the final full-sentence prompt, as token ids."""
    ids = [VOCAB[w] for w in WORDS]
    return [[*ids[:k], VOCAB["xxx"]] for k in range(1, len(ids) + 1)] + [[*ids, VOCAB["."]]]


def run_scenario(tree, allocator) -> list[tuple[int, int]]:
    """Admit, 'prefill' and finish each prompt in order; return (reused, stale) per request.

    `stale` counts reused positions i whose cached KV was written by a request with another token at i+1:
    harmless for the target model, wrong for an EAGLE draft.
    """
    next_token_of_slot: dict[int, int] = {}
    rows = []
    for prompt in seed_prompts():
        req = CachedReq(last_node=tree.root)
        reused = tree.admit(req, prompt)
        stale = sum(next_token_of_slot[int(s)] != prompt[i + 1] for i, s in enumerate(req.kv_slots))
        full = prompt + OUTPUT
        fresh = allocator.alloc(len(full) - 1 - reused)
        req.kv_slots = np.concatenate([req.kv_slots, fresh])
        for i, s in enumerate(req.kv_slots[reused:], start=reused):
            next_token_of_slot[int(s)] = full[i + 1]
        tree.cache_finished_req(req, full)
        tree.check_invariants()
        rows.append((reused, stale))
    return rows


def main() -> None:
    print(__doc__)
    configs = [
        ("RadixCache, token keys", lambda a: RadixCache(a, eagle=False), lambda: CheckedAllocator(256)),
        ("RadixCache, EAGLE bigram keys", lambda a: RadixCache(a, eagle=True), lambda: CheckedAllocator(256)),
        (
            "SWARadixCache W=4, EAGLE bigram keys",
            lambda a: SWARadixCache(a, sliding_window=4, eagle=True),
            lambda: CheckedSWAAllocator(256, 128),
        ),
    ]
    for name, make_tree, make_alloc in configs:
        alloc = make_alloc()
        tree = make_tree(alloc)
        rows = run_scenario(tree, alloc)
        print(f"== {name}")
        print("   reused prompt tokens per request:", [r for r, _ in rows])
        print("   of which stale for an EAGLE draft: ", [s for _, s in rows])
        print("   " + tree.pretty(max_units=6).replace("\n", "\n   "))
        print()


if __name__ == "__main__":
    main()
