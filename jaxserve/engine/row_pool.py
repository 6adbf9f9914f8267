"""`RowPool`: rows of a per-request device buffer (penalty counts, draft state), one per request holding one.

A row is free or held by exactly one request. A fresh pool hands out rows 0, 1, 2, ...; a released row is
the next one handed out. The device buffer
itself belongs to whoever steps it; this pool only says which request owns which row.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator


class RowPool:
    """Rows `0 .. num_rows - 1`. O(1) per call."""

    def __init__(self, num_rows: int) -> None:
        self.num_rows = num_rows
        self._free = list(range(num_rows - 1, -1, -1))
        self._held: dict[Hashable, int] = {}

    def acquire(self, owner: Hashable) -> int:
        """The owner's row, taking a free one if it holds none. Raises RuntimeError when none is free
        (callers bound their owners by `num_rows`)."""
        row = self._held.get(owner)
        if row is None:
            if not self._free:
                raise RuntimeError(f"all {self.num_rows} rows are held")
            row = self._held[owner] = self._free.pop()
        return row

    def release(self, owner: Hashable) -> None:
        """Give the owner's row back (nothing if it holds none)."""
        row = self._held.pop(owner, None)
        if row is not None:
            self._free.append(row)

    def __getitem__(self, owner: Hashable) -> int:
        return self._held[owner]

    def __contains__(self, owner: object) -> bool:
        return owner in self._held

    def __len__(self) -> int:
        """Rows held."""
        return len(self._held)

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._held)
