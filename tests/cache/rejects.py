"""Test helper shared by the bad-input tests of both trees: a rejected call changes nothing. Not a test
module."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest


def assert_rejected_unchanged(
    tree: Any,
    snapshot: Callable[[Any], object],
    call: Callable[[], object],
    exc: type[Exception],
    match: str | None = None,
    live_reqs: Iterable[Any] = (),
) -> None:
    """`call()` raises `exc` (message matching `match`), `snapshot(tree)` is the same before and after, and
    the tree's invariants still hold with `live_reqs` live."""
    before = snapshot(tree)
    with pytest.raises(exc, match=match):
        call()
    assert snapshot(tree) == before
    tree.check_invariants(live_reqs)
