"""Paged extend/decode allocation (SGLang's `alloc_extend` / `alloc_decode` rules), vectorised on the host.

For request i the new token positions are `[prefix_lens[i], seq_lens[i])`. They are filled in order from
(1) the rest of the request's current partial page, continuing at `last_locs[i] + 1` (the slot of position
`prefix_lens[i] - 1`), up to the page end or `seq_lens[i]`; (2) whole new pages; (3) a partial new page.
New pages per request: `ceil(seq / P) - ceil(prefix / P)`, taken in request order. All or nothing: if the
pages do not suffice the result is OutOfSlots and nothing is taken. With page_size 1 this is a plain
allocation of `sum(seq - prefix)` slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jaxserve.memory import allocator as A
from jaxserve.memory.allocator import SLOT_DTYPE, AllocatorState
from jaxserve.memory.errors import InvalidAllocRequestError, OutOfSlots


@dataclass(frozen=True)
class ExtendPlan:
    """Validated extend arguments plus the page count per request (`new_pages`, in all `num_new_pages`) and
    whether any request continues a partial page (`continues_page`; False: all start on a page boundary)."""

    prefix_lens: np.ndarray
    seq_lens: np.ndarray
    last_locs: np.ndarray
    new_pages: np.ndarray
    num_new_pages: int
    continues_page: bool


def plan_extend(
    state: AllocatorState, prefix_lens: np.ndarray, seq_lens: np.ndarray, last_locs: np.ndarray
) -> ExtendPlan:
    """Validate extend arguments (raises InvalidAllocRequestError) and count the new pages needed.

    Cost: O(1) numpy calls; one request (the scheduler's usual call) is checked with Python ints."""
    pre = np.asarray(prefix_lens, dtype=np.int64).reshape(-1)
    seq = np.asarray(seq_lens, dtype=np.int64).reshape(-1)
    last = np.asarray(last_locs, dtype=np.int64).reshape(-1)
    if not (pre.shape == seq.shape == last.shape) or pre.size == 0:
        raise InvalidAllocRequestError(
            f"prefix_lens, seq_lens and last_locs need one equal, non-zero length; got "
            f"{pre.shape}, {seq.shape}, {last.shape}"
        )
    if pre.size == 1:
        return _plan_one(state, pre, seq, last)
    counts = seq - pre
    num_tokens = int(counts.sum())
    if ((pre < 0) | (counts < 0)).any() or num_tokens <= 0:
        raise _bad_lengths()
    p = state.page_size
    if p == 1:  # every new position is a new page; nothing continues a partial page
        return ExtendPlan(pre, seq, last, counts, num_tokens, False)
    partial = (pre % p) != 0
    continues_page = bool(partial.any())
    if continues_page:
        lp = last[partial]
        if (lp < p).any() or (lp >= state.slot_limit).any() or ((lp + 1) % p != pre[partial] % p).any():
            raise _bad_last_locs(p)
        if A.is_slot_free(state, lp).any():
            raise _free_last_locs()
    new_pages = -(-seq // p) - (-(-pre // p))
    return ExtendPlan(pre, seq, last, new_pages, int(new_pages.sum()), continues_page)


def _plan_one(state: AllocatorState, pre: np.ndarray, seq: np.ndarray, last: np.ndarray) -> ExtendPlan:
    """`plan_extend`'s checks and counts for a single request, on Python ints."""
    start, stop, last_loc = int(pre[0]), int(seq[0]), int(last[0])
    if start < 0 or stop <= start:
        raise _bad_lengths()
    p = state.page_size
    if p == 1:
        return ExtendPlan(pre, seq, last, seq - pre, stop - start, False)
    continues_page = start % p != 0
    if continues_page:
        if last_loc < p or last_loc >= state.slot_limit or (last_loc + 1) % p != start % p:
            raise _bad_last_locs(p)
        if A.is_slot_free(state, last).any():
            raise _free_last_locs()
    num_new_pages = -(-stop // p) - (-(-start // p))
    return ExtendPlan(pre, seq, last, np.array([num_new_pages]), num_new_pages, continues_page)


def fresh_pages_of_one(
    state: AllocatorState, prefix_lens: object, seq_lens: object, last_locs: object
) -> tuple[int, int] | None:
    """(new pages, new slots) when the arguments are one request (1-element arrays, the lengths int64) whose
    new positions start on a page boundary, so they fill whole fresh pages and the value of `last_locs`
    plays no part; None otherwise (then `plan_extend` decides, and raises for bad input). Raises
    InvalidAllocRequestError for bad lengths, as `plan_extend` would. Cost: Python ints only."""
    arrays = (prefix_lens, seq_lens, last_locs)
    if not all(type(a) is np.ndarray and a.shape == (1,) for a in arrays):
        return None
    if prefix_lens.dtype != np.int64 or seq_lens.dtype != np.int64:
        return None
    start, stop, p = int(prefix_lens[0]), int(seq_lens[0]), state.page_size
    if start % p:
        return None
    if start < 0 or stop <= start:
        raise _bad_lengths()
    return -(-stop // p) - start // p, stop - start


def _bad_lengths() -> InvalidAllocRequestError:
    return InvalidAllocRequestError("need 0 <= prefix_len <= seq_len per request and at least one new token")


def _bad_last_locs(page_size: int) -> InvalidAllocRequestError:
    return InvalidAllocRequestError(
        "last_locs must be the slot of position prefix_len - 1: an allocatable slot whose offset in "
        f"its page is (prefix_len - 1) % page_size (page_size={page_size})"
    )


def _free_last_locs() -> InvalidAllocRequestError:
    return InvalidAllocRequestError("last_locs points at a page that is free: the request does not own it")


def slots_for_plan(plan: ExtendPlan, pages: np.ndarray, page_size: int) -> np.ndarray:
    """The slots of every new position, request-major, given the plan's freshly allocated pages in order.

    Cost: O(1) numpy calls; the per-position rule runs only when some request continues a partial page."""
    p = page_size
    if p == 1:  # one fresh page per position, handed out in request-major order
        return pages.astype(SLOT_DTYPE, copy=False)
    if not plan.continues_page:  # whole fresh pages per request, page-major; drop last pages' spare slots
        slots = A.pages_to_slots(pages, p)
        if plan.seq_lens.size == 1:
            return slots[: int(plan.seq_lens[0]) - int(plan.prefix_lens[0])]
        counts = plan.seq_lens - plan.prefix_lens
        page_slots = plan.new_pages * p
        unused = page_slots - counts
        if not unused.any():
            return slots
        keep = np.arange(slots.size) < np.repeat(np.cumsum(page_slots) - unused, page_slots)
        return slots[keep]
    counts = plan.seq_lens - plan.prefix_lens
    if (counts == 1).all():
        # decode: one position per request, on a fresh page iff it starts one, else after last_locs
        out = plan.last_locs + 1
        out[plan.new_pages != 0] = pages * p  # the first slot of each fresh page
        return out.astype(SLOT_DTYPE, copy=False)
    req = np.repeat(np.arange(counts.size), counts)
    starts = np.cumsum(counts) - counts
    pos = plan.prefix_lens[req] + (np.arange(req.size) - starts[req])
    first_page = -(-plan.prefix_lens // p)  # the page index (within the request) of the first new page
    in_partial = pos < first_page[req] * p
    page_offset = (np.cumsum(plan.new_pages) - plan.new_pages)[req] + (pos // p - first_page[req])
    new_slot = pages[np.where(in_partial, 0, page_offset)] * p + pos % p if pages.size else pos * 0
    old_slot = plan.last_locs[req] + (pos - plan.prefix_lens[req] + 1)
    return np.where(in_partial, old_slot, new_slot).astype(SLOT_DTYPE)


def alloc_extend(
    state: AllocatorState, prefix_lens: np.ndarray, seq_lens: np.ndarray, last_locs: np.ndarray
) -> tuple[AllocatorState, np.ndarray] | OutOfSlots:
    """Slots for positions `[prefix_lens[i], seq_lens[i])` of every request, concatenated request-major.

    Ownership: the new pages move to the caller; the partial-page slots were already the caller's.
    """
    fresh = fresh_pages_of_one(state, prefix_lens, seq_lens, last_locs)
    if fresh is not None:  # one request starting on a page boundary: whole fresh pages, no plan
        num_pages, num_slots = fresh
        result = A.alloc_pages(state, num_pages)
        if isinstance(result, OutOfSlots):
            return result
        new_state, pages = result
        return new_state, A.pages_to_slots(pages, state.page_size)[:num_slots]
    plan = plan_extend(state, prefix_lens, seq_lens, last_locs)
    new_state, pages = state, np.zeros(0, dtype=SLOT_DTYPE)
    if plan.num_new_pages:
        result = A.alloc_pages(state, plan.num_new_pages)
        if isinstance(result, OutOfSlots):
            return result
        new_state, pages = result
    return new_state, slots_for_plan(plan, pages, state.page_size)


def alloc_decode(
    state: AllocatorState, seq_lens: np.ndarray, last_locs: np.ndarray
) -> tuple[AllocatorState, np.ndarray] | OutOfSlots:
    """One slot per request for position `seq_lens[i] - 1` (seq_lens include the new token).

    A new page when that position starts a page, else `last_locs[i] + 1`.
    """
    seq = np.asarray(seq_lens, dtype=np.int64)
    return alloc_extend(state, seq - 1, seq, last_locs)
