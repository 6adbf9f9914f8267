"""`Request.fill_ids()`: prompt + output from an append-only buffer, viewed (not rebuilt) every step."""

from __future__ import annotations

import numpy as np
import pytest

from jaxserve.engine.request import make_request
from jaxserve.sampling import SamplingParams


def _request(prompt_len: int, max_new: int):
    params = SamplingParams(temperature=0, max_new_tokens=max_new, ignore_eos=True)
    return make_request("r", np.arange(prompt_len, dtype=np.int32), params, tree_root=None, seed=0)


def test_fill_ids_is_prompt_plus_output_after_every_append():
    req = _request(5, 9)
    views = []
    for token in [7, 3, 3, 11, 0, 2, 5]:
        req.stop.append(token)
        fill = req.fill_ids()
        assert fill.dtype == np.int32
        assert fill.tolist() == list(range(5)) + req.output_ids  # the naive concatenation
        views.append(fill)
    # earlier views are still right (the buffer is only appended to) and share the same memory
    assert views[2].tolist() == [0, 1, 2, 3, 4, 7, 3, 3]
    assert all(np.shares_memory(views[0], v) for v in views)


def test_fill_ids_is_read_only():
    req = _request(3, 2)
    with pytest.raises(ValueError):
        req.fill_ids()[0] = 1


def test_fill_ids_copies_only_the_new_tokens():
    """The host work per call is the tokens appended since the last call: a 1M-token prompt adds nothing."""
    req = _request(1 << 20, 4)
    req.fill_ids()
    req.stop.append(9)
    buffer = req.fill_ids()
    req.stop.append(8)
    again = req.fill_ids()
    assert again.base is buffer.base is not None and again[-2:].tolist() == [9, 8]

