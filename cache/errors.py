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
