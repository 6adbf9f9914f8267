"""The OpenAI logprobs shapes built from `meta_info` entries, checked against a brute-force construction."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from jaxserve.server.openai_logprobs import completion_logprobs


def test_a_completions_top_entry_keeps_the_most_likely_of_ids_with_one_text():
    """Top entries are dicts keyed by text: when two ids decode to the same text (an empty string, a byte
    piece), the key holds the more likely id's logprob, so an entry's best is the position's best; every
    text in `top` is a key. Reference: for each text, the max over the ids that decode to it."""
    texts = ["", "a", "b", "a"]  # ids 0..3; ids 1 and 3 decode alike, and 0 is the empty string

    @settings(max_examples=80, deadline=None)
    @given(st.lists(st.lists(st.tuples(st.floats(-30, 0), st.integers(0, 3)), max_size=4), min_size=1,
                    max_size=5), st.integers(0, 10))
    def check(tops, offset):
        tops = [sorted(top, key=lambda e: -e[0]) for top in tops]  # best first, as the engine gives them
        items = [(None if i == 0 else -1.0, i % 4, top) for i, top in enumerate(tops)]
        out = completion_logprobs(items, lambda t: texts[t], offset)
        assert out["top_logprobs"][0] is None
        for top, entry in zip(tops[1:], out["top_logprobs"][1:], strict=True):
            want: dict[str, float] = {}
            for logprob, token_id in top:
                want[texts[token_id]] = max(want.get(texts[token_id], -1e9), logprob)
            assert entry == want
        assert out["text_offset"][0] == offset and out["tokens"] == [texts[i % 4] for i in range(len(tops))]

    check()
