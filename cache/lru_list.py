"""An intrusive doubly linked LRU list: O(1) insert, move and remove, scans from the least recent end.

Each member owns one `LRULink` per list it can be in (a node of the SWA tree has a full-list link and an
SWA-list link), so membership costs no dict and no allocation per operation. The head side is the most
recently used end, the tail side the least recently used one. A link is in a list exactly when `link.prev`
is not None.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


class LRULink:
    """The list pointers of one member in one list; `owner` is the member itself (e.g. a tree node)."""

    __slots__ = ("next", "owner", "prev")

    def __init__(self, owner: Any) -> None:
        self.owner = owner
        self.prev: LRULink | None = None
        self.next: LRULink | None = None


class LRUList:
    """Members ordered from most (head) to least (tail) recently used; all but the scans are O(1)."""

    def __init__(self) -> None:
        self._head = LRULink(None)
        self._tail = LRULink(None)
        self._head.next = self._tail
        self._tail.prev = self._head
        self._len = 0

    def __len__(self) -> int:
        return self._len

    @staticmethod
    def contains(link: LRULink) -> bool:
        return link.prev is not None

    def push_mru(self, link: LRULink) -> None:
        """Insert a link that is not in the list as the most recently used member."""
        self.insert_after(None, link)

    def insert_after(self, anchor: LRULink | None, link: LRULink) -> None:
        """Insert a link that is not in the list right after `anchor` (None: the head): just less recent."""
        if link.prev is not None:
            raise ValueError("link is already in an LRU list")
        before = self._head if anchor is None else anchor
        after = before.next
        link.prev, link.next = before, after
        before.next = link
        after.prev = link  # type: ignore[union-attr]
        self._len += 1

    def remove(self, link: LRULink) -> None:
        """Take a member out of the list."""
        if link.prev is None:
            raise ValueError("link is not in this LRU list")
        link.prev.next = link.next
        link.next.prev = link.prev  # type: ignore[union-attr]
        link.prev = link.next = None
        self._len -= 1

    def move_to_mru(self, link: LRULink) -> None:
        """Make a member the most recently used one."""
        self.move_after(None, link)

    def move_after(self, anchor: LRULink | None, link: LRULink) -> None:
        """Move a member to just after `anchor` (None: the head). The hot path of every touched path, so
        `remove` and `insert_after` are written out here."""
        before = self._head if anchor is None else anchor
        if before is link or before.next is link:
            return  # already there
        if link.prev is None:
            raise ValueError("link is not in this LRU list")
        link.prev.next = link.next
        link.next.prev = link.prev  # type: ignore[union-attr]
        after = before.next
        link.prev, link.next = before, after
        before.next = link
        after.prev = link  # type: ignore[union-attr]

    def lru_where(self, pred: Callable[[Any], bool]) -> Any:
        """The least recently used owner satisfying `pred`, or None. O(members skipped)."""
        return self._scan(self._tail.prev, pred)

    def prev_where(self, link: LRULink, pred: Callable[[Any], bool]) -> Any:
        """The next more recently used owner after `link` (toward the head) satisfying `pred`, or None."""
        return self._scan(link.prev, pred)

    def _scan(self, link: LRULink | None, pred: Callable[[Any], bool]) -> Any:
        head = self._head
        while link is not head and link is not None:
            if pred(link.owner):
                return link.owner
            link = link.prev
        return None

    def owners_mru_first(self) -> Iterator[Any]:
        """All owners from most to least recently used (debug and invariant checks)."""
        link = self._head.next
        while link is not self._tail:
            yield link.owner  # type: ignore[union-attr]
            link = link.next  # type: ignore[union-attr]
