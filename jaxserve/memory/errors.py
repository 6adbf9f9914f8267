"""Exceptions of `jaxserve.memory`. Every allocator error is raised before any state is written.

`DoubleFreeError` and `OutOfSlotsError` are re-exported from `cache.errors`, so the cache and the allocators
speak one error vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

from cache.errors import DoubleFreeError, OutOfSlotsError

__all__ = [
    "AllocatorError",
    "DoubleFreeError",
    "InvalidAllocRequestError",
    "KVLayoutError",
    "OutOfSlots",
    "OutOfSlotsError",
    "SlotRangeError",
    "StaleAllocatorStateError",
]


class AllocatorError(Exception):
    """Base class of the allocator errors defined here."""


class SlotRangeError(AllocatorError, ValueError):
    """A slot (or page) id outside the allocatable range, or on the reserved padding page 0."""


class InvalidAllocRequestError(AllocatorError, ValueError):
    """An allocation of zero or a negative number of slots, or inconsistent extend/decode arguments."""


class StaleAllocatorStateError(AllocatorError, RuntimeError):
    """An allocator state used after a later free overwrote the free-list entries it depends on.

    A state stays valid after any number of allocations made from it or from its descendants; see
    `jaxserve.memory.page_stack` for the exact rule.
    """


class KVLayoutError(ValueError):
    """K/V passed to a pool write with the wrong shape or dtype, or a pool built with bad dimensions."""


@dataclass(frozen=True)
class OutOfSlots:
    """The result of an allocation that cannot be satisfied; the caller's state is unchanged.

    `requested_pages` / `free_pages` are in pages (== slots when page_size is 1).
    """

    requested_pages: int
    free_pages: int
    side: str = "full"

    def __bool__(self) -> bool:  # `if result:` reads as "did the allocation succeed"
        return False

    def raise_error(self) -> None:
        raise OutOfSlotsError(
            f"{self.side} allocator needs {self.requested_pages} pages but only {self.free_pages} are free; "
            "evict from the prefix cache or retract a request first"
        )
