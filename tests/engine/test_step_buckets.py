"""Default step buckets: the narrowest page-table width covers `MIN_CONTEXT_TOKENS` of context whatever the
page size (so a short request keeps one width, one program per token/sequence bucket, for its whole life);
widths double up to the limit, which is always the last bucket."""

from __future__ import annotations

import pytest

from jaxserve.engine.step_input import MIN_CONTEXT_TOKENS, Buckets
from jaxserve.layers.attention_metadata import pick_bucket


@pytest.mark.parametrize("page_size", [1, 4, 16, 64, 512])
def test_the_narrowest_width_covers_the_minimum_context(page_size):
    max_pages = 8192 // page_size
    b = Buckets.for_limits(max_tokens=512, max_seqs=32, max_pages=max_pages, page_size=page_size)
    b.check_covers(max_tokens=512, max_seqs=32, max_pages=max_pages)
    first = b.pages[0]
    assert first * page_size >= min(MIN_CONTEXT_TOKENS, max_pages * page_size) and first >= min(4, max_pages)
    assert all(b2 == 2 * b1 for b1, b2 in zip(b.pages[:-2], b.pages[1:-1], strict=True))
    assert b.pages[-1] == max_pages
    widths = {pick_bucket(-(-n // page_size), b.pages, "pages") for n in range(1, MIN_CONTEXT_TOKENS + 1)}
    assert len(widths) == 1  # every context up to the minimum shares one width


def test_a_pool_smaller_than_the_minimum_has_one_width():
    b = Buckets.for_limits(max_tokens=64, max_seqs=4, max_pages=10, page_size=16)
    assert b.pages == (10,)
