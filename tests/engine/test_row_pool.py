"""`RowPool`: each row is free or held by one owner, against a brute-force dict model."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxserve.engine.row_pool import RowPool


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 7)), max_size=60))
def test_rows_are_held_once_and_come_back(script):
    pool, model = RowPool(4), {}
    for take, owner in script:
        if take and (owner in model or len(model) < 4):
            row = pool.acquire(owner)
            assert model.setdefault(owner, row) == row  # the same row while held
        elif take:
            with pytest.raises(RuntimeError, match="held"):
                pool.acquire(owner)
        else:
            pool.release(owner)
            model.pop(owner, None)
        assert dict((o, pool[o]) for o in pool) == model
        assert len(set(model.values())) == len(model) == len(pool) and set(model.values()) <= set(range(4))


def test_a_fresh_pool_hands_out_rows_in_order():
    pool = RowPool(3)
    assert [pool.acquire(o) for o in "abc"] == [0, 1, 2]
    pool.release("b")
    assert pool.acquire("d") == 1 and "b" not in pool and "d" in pool
