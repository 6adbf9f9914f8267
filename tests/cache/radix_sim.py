"""Test helper: drive a `RadixCache` the way the scheduler will (admit, chunked prefill, decode, finish), with
slots allocated page by page from a `CheckedAllocator`. Not a test module."""

from __future__ import annotations

from dataclasses import dataclass, field

from cache import CachedReq, RadixCache
from cache.testing import CheckedAllocator
from tests.cache.sim_slots import grow_kv_slots


def make_cache(
    num_slots: int, page_size: int = 1, eagle: bool = False, **kw
) -> tuple[RadixCache, CheckedAllocator]:
    alloc = CheckedAllocator(num_slots, page_size)
    return RadixCache(alloc, page_size=page_size, eagle=eagle, **kw), alloc


def extend_slots(cache: RadixCache, req: CachedReq, num_new: int, evict=None) -> bool:
    """Give `req` slots for its next `num_new` positions: first the rest of its partial last page (its own),
    then fresh pages, evicting from the tree (`evict(num_slots)`, default `cache.evict`) when the pool is
    short. False (the request unchanged) if impossible."""
    alloc = cache.allocator

    def make_room(need: int) -> None:
        if alloc.available_size() < need:
            (evict or cache.evict)(need - alloc.available_size())

    return grow_kv_slots(req, num_new, alloc, make_room)


@dataclass
class SimReq:
    """A request's tokens as the scheduler sees them, plus its cache bookkeeping."""

    prompt: list[int]
    req: CachedReq
    outputs: list[int] = field(default_factory=list)
    admitted: int = 0

    @property
    def num_with_kv(self) -> int:
        return int(self.req.kv_slots.shape[0])

    @property
    def prefill_done(self) -> bool:
        return self.num_with_kv >= len(self.prompt)


def admit(cache: RadixCache, prompt: list[int], extra_key=None) -> SimReq:
    sim = SimReq(list(prompt), CachedReq(last_node=cache.root, extra_key=extra_key))
    sim.admitted = cache.admit(sim.req, sim.prompt)
    return sim


def prefill(cache: RadixCache, sim: SimReq, chunk: int | None = None) -> bool:
    """Compute the next prefill chunk (all of the rest if `chunk` is None) and `cache_unfinished_req` it."""
    start = sim.num_with_kv
    stop = len(sim.prompt) if chunk is None else min(start + chunk, len(sim.prompt))
    if not extend_slots(cache, sim.req, stop - start):
        return False
    cache.cache_unfinished_req(sim.req, sim.prompt[:stop])
    return True


def decode(cache: RadixCache, sim: SimReq, token: int) -> bool:
    """Sample `token`; the previously sampled one (if any) is fed now and gets a slot."""
    if sim.outputs and not extend_slots(cache, sim.req, 1):
        return False
    sim.outputs.append(token)
    return True


def finish(cache: RadixCache, sim: SimReq) -> None:
    cache.cache_finished_req(sim.req, sim.prompt + sim.outputs)


def run_request(cache: RadixCache, prompt: list[int], outputs: list[int], chunk: int | None = None) -> int:
    """Admit, prefill (chunked), decode `outputs`, finish. Returns the admitted prefix length."""
    sim = admit(cache, prompt)
    while not sim.prefill_done:
        assert prefill(cache, sim, chunk)
    for tok in outputs:
        assert decode(cache, sim, tok)
    finish(cache, sim)
    return sim.admitted
