"""Hypothesis state machine: random interleavings of match / insert / admit / chunked prefill / decode /
finish / release / lock / unlock / evict(full, swa) over concurrent requests with shared prefixes, for page
sizes 1/4/16 x EAGLE on/off, with small windows so that tombstones and revivals happen often.

The brute-force model is a dict from unit positions to `[slot, live]`: what the tree must hold, position by
position, independent of node boundaries. A position is named by the tokens up to the end of its page (pages
branch as a whole) and its offset in the page. Insert adds missing positions with the caller's slots
and makes every position from `prev_prefix_len` on live (revival keeps the old slot); eviction is not
predicted but audited (only unlocked positions disappear, only positions outside every lock's window lose
their SWA KV, nothing is revived, the returned counts are exact). Matches are recomputed from scratch: the
longest present page-aligned prefix, cut back by the window rule over its runs of tombstoned positions. After
every step: the tree's content equals the model, and `check_invariants` proves ownership on both pools for
the live requests.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from cache import CachedReq, SWARadixCache
from cache.testing import CheckedSWAAllocator
from tests.cache.swa_sim import extend_slots

VOCAB = 3
TOKENS = st.integers(0, VOCAB - 1)


def unit_key(tokens: list[int], pos: int, page_size: int, eagle: bool) -> tuple:
    """The model's name of unit position `pos` of a token sequence: (tokens through its page, offset)."""
    return tuple(tokens[: (pos // page_size + 1) * page_size + eagle]), pos % page_size


def tree_content(tree: SWARadixCache) -> dict[tuple, list]:
    """Every stored position of the tree as `{unit_key: [slot, live]}`."""
    eagle, page_size, out = tree.eagle, tree.page_size, {}
    stack = [(child, []) for child in tree.root.children.values()]
    while stack:
        node, parent_tokens = stack.pop()
        toks = node.key.tokens.tolist()
        path = parent_tokens + (toks[1:] if eagle and parent_tokens else toks)
        start = len(path) - eagle - node.num_units
        for i, slot in enumerate(node.value.tolist()):
            out[unit_key(path, start + i, page_size, eagle)] = [slot, not node.tombstone]
        stack.extend((child, path) for child in node.children.values())
    return out


def expected_match(model: dict, tokens: list[int], page_size: int, eagle: bool, window: int) -> list[int]:
    """The window rule recomputed per position: candidates are the start of each tombstone run
    preceded by >= window live positions (or by no tombstone at all), and the walk's end if the live run
    after the last tombstone is >= window (or there is none); the answer is the last candidate."""
    num_units = max(len(tokens) - eagle, 0)
    num_units -= num_units % page_size
    end = 0
    while end + page_size <= num_units and unit_key(tokens, end, page_size, eagle) in model:
        end += page_size
    best, since, prev_live = 0, float("inf"), True
    for p in range(end):
        live = model[unit_key(tokens, p, page_size, eagle)][1]
        if not live and prev_live:
            if since >= window:
                best = p
            since = 0
        if live:
            since += 1
        prev_live = live
    if since >= window:
        best = end
    return [model[unit_key(tokens, p, page_size, eagle)][0] for p in range(best)]


class SWAMachine(RuleBasedStateMachine):
    page_size = 1
    eagle = False
    num_full_pages = 40
    num_swa_pages = 14  # scarcer than full: allocation-driven evictions tombstone too

    @initialize(window=st.integers(1, 3), seed=st.integers(0, 2**16))
    def setup(self, window: int, seed: int) -> None:
        """`window` in pages (in tokens at P=1)."""
        p = self.page_size
        self.window = window * p
        self.alloc = CheckedSWAAllocator(self.num_full_pages * p, self.num_swa_pages * p, p)
        self.tree = SWARadixCache(self.alloc, sliding_window=self.window, page_size=p, eagle=self.eagle)
        rng = np.random.default_rng(seed)
        self.bases = [rng.integers(0, VOCAB, 6 * p + 4).tolist() for _ in range(2)]
        self.model: dict[tuple, list] = {}
        self.reqs: list[dict] = []  # live requests: {"req", "prompt", "outputs", "decoding"}
        self.locks: list[tuple] = []  # external locks: (node, lock_id, path tokens, units)

    # ------------------------------------------------------------ helpers
    def tokens(self, base: int, cut: int, suffix: list[int]) -> list[int]:
        b = self.bases[base]
        return b[: cut % (len(b) + 1)] + suffix

    def model_insert(self, tokens: list[int], num_units: int, slots: np.ndarray, prev: int) -> None:
        prev -= prev % self.page_size
        for p in range(num_units):
            key = self.key(tokens, p)
            if key in self.model:
                if p >= prev:
                    self.model[key][1] = True
            else:
                self.model[key] = [int(slots[p]), True]

    def key(self, tokens: list[int], pos: int) -> tuple:
        return unit_key(tokens, pos, self.page_size, self.eagle)

    def present_units(self, tokens: list[int], num_units: int) -> int:
        n = 0
        while n + self.page_size <= num_units and self.key(tokens, n) in self.model:
            n += self.page_size
        return n

    def held(self) -> list[tuple[list[int], int]]:
        """(tokens, locked units) of every live lock: requests and external locks."""
        out = [(r["prompt"] + r["outputs"], r["req"].last_matched_prefix_len) for r in self.reqs]
        return out + [(toks, units) for _, _, toks, units in self.locks]

    def kv_units(self, num_tokens: int) -> int:
        n = max(num_tokens - self.eagle, 0)
        return n - n % self.page_size

    def drop(self, i: int) -> None:
        self.tree.release_req(self.reqs.pop(i)["req"])

    # ------------------------------------------------------------ rules
    @rule(base=st.integers(0, 1), cut=st.integers(0, 100), suffix=st.lists(TOKENS, max_size=5))
    def match(self, base: int, cut: int, suffix: list[int]) -> None:
        toks = self.tokens(base, cut, suffix)
        expected = expected_match(self.model, toks, self.page_size, self.eagle, self.window)
        assert self.tree.match_prefix(toks).slots.tolist() == expected

    @rule(base=st.integers(0, 1), cut=st.integers(0, 100), suffix=st.lists(TOKENS, max_size=9))
    def insert(self, base: int, cut: int, suffix: list[int]) -> None:
        toks = self.tokens(base, cut, suffix)
        num_units = self.kv_units(len(toks))
        if num_units == 0:
            return
        if self.alloc.full_available_size() < num_units or self.alloc.swa_available_size() < num_units:
            self.tree.evict(num_units, num_units)
            self.sync_after_evict_unchecked()
        slots = self.alloc.alloc(num_units)
        if slots is None:
            return
        cached = self.present_units(toks, num_units)
        assert self.tree.insert(toks[: num_units + self.eagle], slots) == cached
        self.model_insert(toks, num_units, slots, 0)

    @precondition(lambda self: len(self.reqs) < 4)
    @rule(base=st.integers(0, 1), cut=st.integers(0, 100), suffix=st.lists(TOKENS, max_size=9))
    def admit(self, base: int, cut: int, suffix: list[int]) -> None:
        prompt = self.tokens(base, cut, suffix) or [0]
        expected = expected_match(self.model, prompt[:-1], self.page_size, self.eagle, self.window)
        req = CachedReq(last_node=self.tree.root)
        assert self.tree.admit(req, prompt) == len(expected)
        assert req.kv_slots.tolist() == expected
        self.reqs.append({"req": req, "prompt": prompt, "outputs": [], "decoding": False})

    @precondition(lambda self: self.reqs)
    @rule(i=st.integers(0, 3), chunk=st.integers(1, 6))
    def prefill_chunk(self, i: int, chunk: int) -> None:
        """Prefill `chunk` tokens (times half a page: chunks end inside pages too)."""
        chunk *= max(self.page_size // 2, 1)
        i %= len(self.reqs)
        r = self.reqs[i]
        req, prompt = r["req"], r["prompt"]
        if r["decoding"]:
            return
        stop = min(req.prefix_len + chunk, len(prompt))
        if not extend_slots(self.tree, req, stop - req.kv_slots.shape[0]):
            self.sync_after_evict_unchecked()
            return self.drop(i)
        self.sync_after_evict_unchecked()
        if stop == len(prompt):  # the last chunk goes on to decode; it samples the first output token
            r["decoding"] = True
            r["outputs"].append(len(prompt) % VOCAB)
            return
        owned = req.last_matched_prefix_len
        num_units = self.kv_units(stop)
        got = self.tree.cache_unfinished_req(req, prompt[:stop])
        if num_units > owned:
            assert got == (owned, num_units)
            self.model_insert(prompt, num_units, req.kv_slots, owned)  # slots: the tree's where it had them
        else:
            assert got == (owned, owned)
        assert req.prefix_len == stop and req.last_matched_prefix_len == max(owned, num_units)
        model_slots = [self.model[self.key(prompt, p)][0] for p in range(num_units)]
        assert req.kv_slots[:num_units].tolist() == model_slots

    @precondition(lambda self: any(r["decoding"] for r in self.reqs))
    @rule(i=st.integers(0, 3), token=st.integers(0, VOCAB - 1))
    def decode(self, i: int, token: int) -> None:
        i %= len(self.reqs)
        r = self.reqs[i]
        if not r["decoding"]:
            return
        if not extend_slots(self.tree, r["req"], 1):
            self.sync_after_evict_unchecked()
            return self.drop(i)
        self.sync_after_evict_unchecked()
        r["outputs"].append(token)

    @precondition(lambda self: any(r["decoding"] for r in self.reqs))
    @rule(i=st.integers(0, 3))
    def finish(self, i: int) -> None:
        i %= len(self.reqs)
        r = self.reqs[i]
        if not r["decoding"]:
            return
        req, tokens = r["req"], r["prompt"] + r["outputs"]
        owned, kv = req.last_matched_prefix_len, req.kv_slots.copy()
        num_units = self.kv_units(len(tokens) - 1)
        self.tree.cache_finished_req(req, tokens)
        if num_units > owned:
            self.model_insert(tokens, num_units, kv, owned)
        self.reqs.pop(i)
        assert req.kv_slots.shape[0] == 0 and req.last_node is self.tree.root

    @precondition(lambda self: self.reqs)
    @rule(i=st.integers(0, 3))
    def release(self, i: int) -> None:
        self.drop(i % len(self.reqs))

    @precondition(lambda self: len(self.locks) < 3)
    @rule(base=st.integers(0, 1), cut=st.integers(0, 100))
    def lock(self, base: int, cut: int) -> None:
        toks = self.tokens(base, cut, [])
        slots, node = self.tree.match_prefix(toks)
        lock_id = self.tree.inc_lock_ref(node)
        units = slots.shape[0]
        self.locks.append((node, lock_id, toks[: units + self.eagle], units))

    @precondition(lambda self: self.locks)
    @rule(i=st.integers(0, 2))
    def unlock(self, i: int) -> None:
        node, lock_id, _, _ = self.locks.pop(i % len(self.locks))
        self.tree.dec_lock_ref(node, lock_id)

    @rule(full=st.sampled_from([0, 0, 0, 1, 3, 40]), swa=st.integers(0, 12))
    def evict(self, full: int, swa: int) -> None:
        """Amounts in pages; mostly SWA-only, so that interior nodes become tombstones."""
        before = {k: list(v) for k, v in self.model.items()}
        full_freed, swa_freed = self.tree.evict(full * self.page_size, swa * self.page_size)
        removed, tombstoned = self.sync_after_evict(before)
        assert full_freed == len(removed)
        assert swa_freed == sum(1 for k in removed if before[k][1]) + len(tombstoned)
        if full_freed < full * self.page_size:  # stopped short: no unlocked leaf is left
            assert all(n.full_lock_ref or n.children for n in self.tree.iter_nodes())

    # ------------------------------------------------------------ eviction audit
    def sync_after_evict(self, before: dict) -> tuple[set, set]:
        after = tree_content(self.tree)
        assert after.keys() <= before.keys()
        assert all(after[k][0] == before[k][0] for k in after)
        assert not [k for k in after if after[k][1] and not before[k][1]], "eviction revived a position"
        removed = before.keys() - after.keys()
        tombstoned = {k for k in after if before[k][1] and not after[k][1]}
        for toks, units in self.held():
            locked = [self.key(toks, p) for p in range(units)]
            assert not removed.intersection(locked), "evicted a locked position"
            window = locked[max(units - self.window, 0) :]
            assert not tombstoned.intersection(window), "tombstoned a position inside a lock's window"
        self.model = after
        return removed, tombstoned

    def sync_after_evict_unchecked(self) -> None:
        """After an eviction triggered by allocation: audit it the same way (counts are not returned)."""
        self.sync_after_evict({k: list(v) for k, v in self.model.items()})

    # ------------------------------------------------------------ invariants
    @invariant()
    def tree_equals_model_and_ownership_holds(self) -> None:
        if not hasattr(self, "tree"):
            return
        assert tree_content(self.tree) == self.model
        self.tree.check_invariants([r["req"] for r in self.reqs])

    def teardown(self) -> None:
        if not hasattr(self, "tree"):
            return
        for node, lock_id, _, _ in self.locks:
            self.tree.dec_lock_ref(node, lock_id)
        while self.reqs:
            self.drop(0)
        assert self.tree.full_protected_size == self.tree.swa_protected_size == 0
        assert self.tree.check_invariants()["live_only"] == 0
        self.tree.reset()
        assert self.tree.check_invariants() == {
            "free": self.alloc.num_pages * self.page_size,
            "tree": 0,
            "live_only": 0,
            "swa_free": self.alloc.num_swa_pages * self.page_size,
        }


SETTINGS = settings(
    max_examples=100, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("eagle", [False, True])
def test_swa_tree_against_brute_force_model(page_size: int, eagle: bool) -> None:
    machine = type(f"SWAMachineP{page_size}{'Eagle' if eagle else ''}", (SWAMachine,), {})
    machine.page_size, machine.eagle = page_size, eagle
    run_state_machine_as_test(machine, settings=SETTINGS)


def test_expected_match_model_on_the_reference_examples() -> None:
    """The per-position window model reproduces the window rule's worked examples (it is not a copy of the
    tree's node-level walk, so check it on known answers)."""
    a, b, c = (1, 2, 3), (4, 5), (6, 7, 8)
    toks = list(a + b + c)

    def model(live: list[bool]) -> dict:
        return {unit_key(toks, p, 1, False): [100 + p, live[p]] for p in range(8)}

    ex1 = model([False] * 3 + [True] * 5)
    assert len(expected_match(ex1, toks, 1, False, 4)) == 8
    assert len(expected_match(ex1, toks, 1, False, 6)) == 0
    ex2 = model([True] * 3 + [False] * 2 + [True] * 3)
    assert len(expected_match(ex2, toks, 1, False, 4)) == 3
    assert len(expected_match(model([True] * 8), [*toks, 9], 1, False, 50)) == 8
