"""Random interleavings of everything the scheduler does with a RadixCache, against a brute-force model.

The model is a dict: every cached prefix that ends on a page boundary, as its namespace (extra_key) and the
tokens that make it up (`i` tokens for `i` units, `i + 1` under EAGLE) -> the slots of its last page. A prefix
is matchable iff all its pages are in the dict. Several requests sharing prefixes are admitted, prefilled in
chunks (`cache_unfinished_req`), decoded, finished or released, interleaved with direct match / insert /
lock / unlock / evict calls. After every step: the tree holds exactly the model's prefixes with the model's
slots, matched lengths and returned counts equal the model's, lock counts equal the live locks, and
`check_invariants` proves that every page is free, in the tree, or private to one live request (the
CheckedAllocator raises on any double free). Page sizes 1 / 4 / 16, EAGLE off / on.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from cache import CachedReq, RadixCache
from cache.testing import CheckedAllocator
from tests.cache.radix_sim import SimReq, extend_slots

MAX_LIVE = 3
NUM_PAGES = 24


class RadixMachine(RuleBasedStateMachine):
    PAGE_SIZE = 1
    EAGLE = False

    def __init__(self) -> None:
        super().__init__()
        p = self.PAGE_SIZE
        self.alloc = CheckedAllocator(NUM_PAGES * p, p)
        self.cache = RadixCache(self.alloc, page_size=p, eagle=self.EAGLE)
        self.model: dict[tuple[int, ...], tuple[int, ...]] = {}  # tokens to a page end -> its slots
        self.reqs: list[SimReq] = []
        self.locks: list = []  # nodes locked by direct inc_lock_ref calls
        rng = np.random.default_rng(7)
        self.base_len = 3 * p + 4
        self.bases = [rng.integers(10, 14, self.base_len).tolist() for _ in range(2)]

    # ------------------------------------------------------------------ model
    def units_of(self, num_tokens: int) -> int:
        units = max(num_tokens - self.EAGLE, 0)
        return units - units % self.PAGE_SIZE

    def model_match(self, tokens: list[int], ns: str | None = None) -> list[int]:
        out: list[int] = []
        p, e = self.PAGE_SIZE, self.EAGLE
        for end in range(p, self.units_of(len(tokens)) + 1, p):
            page = self.model.get((ns, *tokens[: end + e]))
            if page is None:
                break
            out.extend(page)
        return out

    def model_insert(self, tokens: list[int], slots: np.ndarray, ns: str | None = None) -> int:
        """Cache the units of `tokens` (whole pages) with `slots`; return the count of units cached before."""
        num_cached, p, e = 0, self.PAGE_SIZE, self.EAGLE
        for end in range(p, len(tokens) - e + 1, p):
            key = (ns, *tokens[: end + e])
            if key in self.model:
                assert num_cached == end - p, "model prefixes must be closed"
                num_cached = end
            else:
                self.model[key] = tuple(int(x) for x in slots[end - p : end])
        return num_cached

    def tree_dict(self) -> dict[tuple[int, ...], tuple[int, ...]]:
        """The tree in the model's form: the tokens up to each page end -> that page's slots."""
        out: dict[tuple[int, ...], tuple[int, ...]] = {}
        p, e = self.PAGE_SIZE, self.EAGLE
        stack = [(child, []) for child in self.cache.root.children.values()]
        while stack:
            node, path = stack.pop()
            tokens = node.key.tokens.tolist()
            path = path + (tokens[1:] if e and path else tokens)
            first_unit = len(path) - e - node.num_units
            values = node.value.tolist()
            for j in range(0, node.num_units, p):
                out[(node.key.extra_key, *path[: first_unit + j + p + e])] = tuple(values[j : j + p])
            stack.extend((child, path) for child in node.children.values())
        return out

    def evict(self, num_slots: int) -> int:
        """Evict through the tree, check what went against the model, and forget it there."""
        evictable = self.cache.evictable_size
        evicted = self.cache.evict(num_slots)
        now = self.tree_dict()
        assert now.items() <= self.model.items()
        assert evicted == (len(self.model) - len(now)) * self.PAGE_SIZE
        assert evicted >= min(num_slots, 1) if evictable else evicted == 0
        if evicted < num_slots:
            assert self.cache.evictable_size == 0
        self.model = now
        return evicted

    # ------------------------------------------------------------------ helpers
    def prompt(self, base: int, cut: int, tail: list[int]) -> list[int]:
        return self.bases[base][: cut % (self.base_len + 1)] + tail

    def pick(self, index: int, want=lambda sim: True) -> SimReq | None:
        candidates = [sim for sim in self.reqs if want(sim)]
        return candidates[index % len(candidates)] if candidates else None

    def extend(self, sim: SimReq, num_new: int) -> bool:
        return extend_slots(self.cache, sim.req, num_new, evict=self.evict)

    def cache_prefix(self, sim: SimReq, tokens: list[int], num_units: int, old_kv: np.ndarray) -> int:
        """Model side of the request ops' insert: returns the count the tree had already."""
        return self.model_insert(tokens[: num_units + self.EAGLE], old_kv[:num_units], sim.req.extra_key)

    # ------------------------------------------------------------------ request rules
    tails = st.lists(st.integers(10, 13), max_size=8)
    namespaces = st.sampled_from([None, None, None, "lora-a"])  # extra_key: mostly shared, sometimes isolated

    @precondition(lambda self: len(self.reqs) < MAX_LIVE)
    @rule(base=st.integers(0, 1), cut=st.integers(0, 100), tail=tails, ns=namespaces)
    def admit(self, base: int, cut: int, tail: list[int], ns: str | None) -> None:
        prompt = self.prompt(base, cut, tail)
        if len(prompt) < 2:
            return
        sim = SimReq(prompt, CachedReq(last_node=self.cache.root, extra_key=ns))
        want = self.model_match(prompt[:-1], ns)
        sim.admitted = self.cache.admit(sim.req, prompt)
        assert sim.admitted == len(want) and sim.req.kv_slots.tolist() == want
        self.reqs.append(sim)

    @rule(index=st.integers(0, 10), chunk=st.integers(1, 40))
    def prefill_chunk(self, index: int, chunk: int) -> None:
        sim = self.pick(index, lambda s: not s.prefill_done)
        if sim is not None:
            self.prefill(sim, chunk)

    @rule(index=st.integers(0, 10), chunk=st.integers(1, 40), tokens=st.lists(st.integers(10, 13), min_size=1,
          max_size=3), finish=st.booleans())  # fmt: skip
    def advance(self, index: int, chunk: int, tokens: list[int], finish: bool) -> None:
        """The next thing the scheduler would do to a request: a prefill chunk, or decode steps (+ finish)."""
        sim = self.pick(index)
        if sim is None:
            return
        if not sim.prefill_done:
            self.prefill(sim, chunk)
            return
        for token in tokens:
            if sim.outputs and not self.extend(sim, 1):  # the previous sampled token is fed: it needs a slot
                break
            sim.outputs.append(token)
        if finish:
            self.finish(sim)

    def prefill(self, sim: SimReq, chunk: int) -> None:
        start = sim.num_with_kv
        stop = min(start + 1 + chunk % (2 * self.PAGE_SIZE + 2), len(sim.prompt))  # often ends mid-page
        if not self.extend(sim, stop - start):
            return
        req = sim.req
        owned, old_kv = req.last_matched_prefix_len, req.kv_slots.copy()
        num_units = self.units_of(stop)
        num_cached = self.cache_prefix(sim, sim.prompt, num_units, old_kv) if num_units > owned else owned
        rewritten = self.cache.cache_unfinished_req(req, sim.prompt[:stop])
        assert rewritten == (owned, max(owned, num_cached))
        assert req.prefix_len == stop and req.last_matched_prefix_len == max(num_units, owned)
        tree_part = req.last_matched_prefix_len
        want = self.model_match(sim.prompt[: tree_part + self.EAGLE], req.extra_key)
        assert req.kv_slots[:tree_part].tolist() == want
        assert req.kv_slots[tree_part:].tolist() == old_kv[tree_part:].tolist()

    def finish(self, sim: SimReq) -> None:
        req = sim.req
        tokens = sim.prompt + sim.outputs
        num_units = self.units_of(len(tokens) - 1)
        if num_units > req.last_matched_prefix_len:
            self.cache_prefix(sim, tokens, num_units, req.kv_slots)
        self.cache.cache_finished_req(req, tokens)
        assert req.kv_slots.shape == (0,) and req.last_node is self.cache.root
        self.reqs.remove(sim)

    @rule(index=st.integers(0, 10))
    def release(self, index: int) -> None:
        sim = self.pick(index)
        if sim is not None:
            self.cache.release_req(sim.req)
            self.reqs.remove(sim)

    # ------------------------------------------------------------------ direct tree rules
    @rule(base=st.integers(0, 1), cut=st.integers(0, 100), tail=tails, ns=namespaces)
    def insert(self, base: int, cut: int, tail: list[int], ns: str | None) -> None:
        tokens = self.prompt(base, cut, tail)
        num_units = self.units_of(len(tokens))
        if num_units == 0:
            return
        if self.alloc.available_size() < num_units:
            self.evict(num_units - self.alloc.available_size())
        slots = self.alloc.alloc(num_units)
        if slots is None:
            return
        want = self.model_insert(tokens[: num_units + self.EAGLE], slots, ns)
        num_cached = self.cache.insert(tokens[: num_units + self.EAGLE], slots, extra_key=ns)
        assert num_cached == want
        if num_cached:
            self.alloc.free(slots[:num_cached])  # the caller's duplicates

    @rule(base=st.integers(0, 1), cut=st.integers(0, 100), tail=tails, lock=st.booleans(), ns=namespaces)
    def match(self, base: int, cut: int, tail: list[int], lock: bool, ns: str | None) -> None:
        tokens = self.prompt(base, cut, tail)
        slots, node = self.cache.match_prefix(tokens, extra_key=ns)
        assert slots.tolist() == self.model_match(tokens, ns)
        assert sum(n.num_units for n in node.path_from_root()) == slots.shape[0]
        if lock:
            self.cache.inc_lock_ref(node)
            self.locks.append(node)

    @precondition(lambda self: self.locks)
    @rule(index=st.integers(0, 10))
    def unlock(self, index: int) -> None:
        self.cache.dec_lock_ref(self.locks.pop(index % len(self.locks)))

    @rule(num_slots=st.integers(1, 40))
    def evict_rule(self, num_slots: int) -> None:
        self.evict(num_slots)

    # ------------------------------------------------------------------ invariants
    @invariant()
    def tree_equals_model(self) -> None:
        assert self.tree_dict() == self.model

    @invariant()
    def ownership_and_accounting(self) -> None:
        self.cache.check_invariants(live_reqs=[sim.req for sim in self.reqs])
        assert self.cache.evictable_size + self.cache.protected_size == self.cache.total_size()

    @invariant()
    def lock_counts_are_exact(self) -> None:
        want: Counter = Counter()
        for node in [sim.req.last_node for sim in self.reqs] + self.locks:
            want.update(node.path_from_root())
        for node in self.cache.iter_nodes():
            assert node.lock_ref == want[node], f"{node!r} expected lock_ref {want[node]}"

    def teardown(self) -> None:
        for sim in self.reqs:
            self.cache.release_req(sim.req)
        for node in self.locks:
            self.cache.dec_lock_ref(node)
        self.cache.evict(NUM_PAGES * self.PAGE_SIZE)
        assert self.alloc.available_size() == NUM_PAGES * self.PAGE_SIZE  # nothing leaked


SETTINGS = settings(
    max_examples=100, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def machine(page_size: int, eagle: bool) -> type[RadixMachine]:
    name = f"RadixMachineP{page_size}{'Eagle' if eagle else ''}"
    return SETTINGS(type(name, (RadixMachine,), {"PAGE_SIZE": page_size, "EAGLE": eagle}))


TestRadixP1 = machine(1, False).TestCase
TestRadixP1Eagle = machine(1, True).TestCase
TestRadixP4 = machine(4, False).TestCase
TestRadixP4Eagle = machine(4, True).TestCase
TestRadixP16 = machine(16, False).TestCase
TestRadixP16Eagle = machine(16, True).TestCase
