"""Exceptions raised by the prefix cache. Every one leaves the tree exactly as it was before the call."""


class CacheError(Exception):
    """Base class of every error the `cache` package raises on bad input or misuse."""


class InvalidTokensError(CacheError, ValueError):
    """Token ids that are not non-negative integers (or not a 1-D sequence)."""


class ValueLengthError(CacheError, ValueError):
    """A value (slot array) whose length does not fit its key (key units, or pages)."""


class PageAlignmentError(CacheError, ValueError):
    """A key or value that must be a whole number of pages is not."""


class ExtraKeyMismatchError(CacheError, ValueError):
    """Two keys from different `extra_key` namespaces were compared."""


class LockError(CacheError, RuntimeError):
    """Unlocking a node that holds no lock, or a lock id that does not belong to the path."""


class EvictLockedError(CacheError, RuntimeError):
    """An explicit request to evict a node (or path) that is locked by a live request."""


class DoubleFreeError(CacheError, RuntimeError):
    """A slot (or page) returned to an allocator that already holds it as free."""


class OutOfSlotsError(CacheError, RuntimeError):
    """An allocator could not satisfy a request even though the caller required it to."""


class InvalidSlotsError(CacheError, ValueError):
    """Slot ids that are not integers, not 1-D, or point into the reserved page 0."""


class InvariantError(CacheError, AssertionError):
    """`check_invariants()` found a broken ownership or accounting rule (a bug in the cache or its caller)."""


class RequestStateError(CacheError, ValueError):
    """A request-level call that does not fit the request's state (e.g. finishing with fewer tokens than it
    already holds, or admitting a request that still holds slots)."""


class StateError(CacheError, ValueError):
    """A tree state that cannot be exported (a live request holds a lock) or imported (it does not describe
    a valid tree of this kind, or the tree to import into is not empty)."""
