"""`cache.lru_list`: the intrusive LRU list against a plain Python list (head = most recent)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache.lru_list import LRULink, LRUList

OPS = st.lists(
    st.tuples(st.sampled_from(["push", "remove", "mru", "after"]), st.integers(0, 7), st.integers(0, 7)),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops=OPS)
def test_lru_list_matches_a_python_list(ops: list[tuple[str, int, int]]) -> None:
    links = [LRULink(i) for i in range(8)]
    lru, model = LRUList(), []
    for op, a, b in ops:
        if op == "push" and a not in model:
            lru.push_mru(links[a])
            model.insert(0, a)
        elif op == "remove" and a in model:
            lru.remove(links[a])
            model.remove(a)
        elif op == "mru" and a in model:
            lru.move_to_mru(links[a])
            model.remove(a)
            model.insert(0, a)
        elif op == "after" and a in model and b in model:
            lru.move_after(links[b], links[a])
            if a != b:
                model.remove(a)
                model.insert(model.index(b) + 1, a)
        assert list(lru.owners_mru_first()) == model
        assert len(lru) == len(model)
        assert all(LRUList.contains(links[i]) == (i in model) for i in range(8))
    odd = [i for i in reversed(model) if i % 2]
    assert lru.lru_where(lambda i: i % 2 == 1) == (odd[0] if odd else None)
    if len(model) >= 2:
        later = [i for i in reversed(model[:-1]) if i % 2]  # toward the head from the least recent member
        assert lru.prev_where(links[model[-1]], lambda i: i % 2 == 1) == (later[0] if later else None)


def test_double_insert_and_foreign_remove_raise() -> None:
    lru, link = LRUList(), LRULink("x")
    lru.push_mru(link)
    with pytest.raises(ValueError, match="already"):
        lru.push_mru(link)
    lru.remove(link)
    with pytest.raises(ValueError, match="not in"):
        lru.remove(link)
    assert lru.lru_where(lambda _: True) is None
