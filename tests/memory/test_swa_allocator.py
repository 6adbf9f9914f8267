"""The SWA allocator vs a brute-force model: two free sets plus a full-page -> SWA-page dict."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxserve.memory import extend as E
from jaxserve.memory import swa_allocator as S
from jaxserve.memory.errors import DoubleFreeError, OutOfSlots, StaleAllocatorStateError


class Model:
    def __init__(self, num_full: int, num_swa: int, p: int) -> None:
        self.p = p
        self.full = set(range(1, num_full + 1))
        self.swa = set(range(1, num_swa + 1))
        self.map: dict[int, int] = {}  # allocated full page -> SWA page (absent: tombstoned)

    def copy(self) -> Model:
        m = Model(0, 0, self.p)
        m.full, m.swa, m.map = set(self.full), set(self.swa), dict(self.map)
        return m

    def check(self, state: S.SWAAllocatorState, owned: list[np.ndarray]) -> None:
        p = self.p
        assert S.free_slot_ids(state).tolist() == sorted(q * p + o for q in self.full for o in range(p))
        assert S.free_swa_slot_ids(state).tolist() == sorted(q * p + o for q in self.swa for o in range(p))
        for slots in owned:
            expect = [
                self.map.get(s // p, 0) * p + s % p if s // p in self.map else 0 for s in slots.tolist()
            ]
            assert S.swa_slots_of(state, slots).tolist() == expect
        assert len(set(self.map.values())) == len(self.map)  # no SWA page behind two full pages
        assert set(self.map.values()).isdisjoint(self.swa)


@settings(max_examples=50, deadline=None)
@given(
    num_full=st.integers(1, 10),
    num_swa=st.integers(1, 10),
    page_size=st.sampled_from([1, 2, 4]),
    data=st.data(),
)
def test_swa_allocator_matches_model(num_full: int, num_swa: int, page_size: int, data) -> None:
    p = page_size
    state = S.make_swa_allocator(num_full, num_swa, p)
    model = Model(num_full, num_swa, p)
    owned: list[np.ndarray] = []
    backups: list[tuple[S.SWAAllocatorState, Model, int]] = []
    num_frees = 0
    for _ in range(data.draw(st.integers(1, 20))):
        op = data.draw(st.sampled_from(["alloc", "free", "free_swa", "backup", "restore", "double"]))
        if op == "alloc":
            n = data.draw(st.integers(1, 3 * p))
            need = -(-n // p)
            result = S.alloc(state, n)
            if need > min(len(model.full), len(model.swa)):
                assert isinstance(result, OutOfSlots)
                assert result.side == ("full" if need > len(model.full) else "swa")
            else:
                state, slots = result
                full_pages = {s // p for s in slots.tolist()}
                swa = S.swa_slots_of(state, slots)
                assert np.array_equal(swa % p, slots % p)  # same offset in the mapped page
                swa_pages = {s // p for s in swa.tolist()}
                assert full_pages <= model.full and swa_pages <= model.swa
                assert len(full_pages) == len(swa_pages) == need
                model.full -= full_pages
                model.swa -= swa_pages
                for s, w in zip(slots.tolist(), swa.tolist(), strict=True):
                    model.map[s // p] = w // p
                owned.append(slots)
        elif op in ("free", "free_swa") and owned:
            i = data.draw(st.integers(0, len(owned) - 1))
            slots = owned[i]
            pages = {s // p for s in slots.tolist()}
            if op == "free":
                freed = slots[:1] if data.draw(st.booleans()) else slots
                state = S.free(state, freed)
                for q in {s // p for s in freed.tolist()}:
                    model.full.add(q)
                    if q in model.map:
                        model.swa.add(model.map.pop(q))
                rest = slots[~np.isin(slots // p, freed // p)]
                owned[i : i + 1] = [rest] if rest.size else []
            else:
                state = S.free_swa(state, slots)  # tombstone: only the SWA side
                for q in pages:
                    if q in model.map:
                        model.swa.add(model.map.pop(q))
            num_frees += 1
        elif op == "backup":
            backups.append((state, model.copy(), num_frees))
        elif op == "restore" and backups:
            saved, saved_model, frees_then = backups[data.draw(st.integers(0, len(backups) - 1))]
            try:
                S.free_slot_ids(saved)
            except StaleAllocatorStateError:
                assert num_frees > frees_then, "a backup with no free or restore after it must stay valid"
                continue
            state, model = saved, saved_model.copy()
            owned = [o[~np.isin(o // p, list(model.full) or [-1])] for o in owned]
            num_frees += 1  # a restore starts a sibling branch: older backups may go stale (not guaranteed)
            owned = [o for o in owned if o.size]
        elif op == "double" and model.full:
            victim = min(model.full) * p
            with pytest.raises(DoubleFreeError):
                S.free(state, np.array([victim]))
            with pytest.raises(DoubleFreeError):
                S.free_swa(state, np.array([victim]))
        model.check(state, owned)


def test_free_after_free_swa_frees_no_swa_page_twice() -> None:
    """SGLang's free-after-tombstone rule: free_swa zeroes the mapping, a later free skips it."""
    state = S.make_swa_allocator(8, 8, 1)
    state, slots = S.alloc(state, 3)
    state = S.free_swa(state, slots[:2])
    assert S.swa_available_size(state) == 7 and S.full_available_size(state) == 5
    assert S.swa_slots_of(state, slots).tolist()[:2] == [0, 0]
    state = S.free_swa(state, slots[:2])  # idempotent
    state = S.free(state, slots)
    assert S.swa_available_size(state) == 8 and S.full_available_size(state) == 8


def test_sglang_pr_swa_pool_example() -> None:
    """PR #11231's test: 16 + 16 slots; after alloc(1) each side lost one."""
    state = S.make_swa_allocator(16, 16, 1)
    assert S.full_available_size(state) + S.swa_available_size(state) == 32
    state, _ = S.alloc(state, 1)
    assert S.full_available_size(state) + S.swa_available_size(state) == 30


def test_speculative_rollback_and_stale_rules() -> None:
    state = S.make_swa_allocator(16, 8, 2)
    state, kept = S.alloc(state, 4)
    saved = state
    state, draft = S.alloc(state, 6)
    state = saved  # restore: the draft's pages are free again
    assert S.full_available_size(state) == 28 and S.swa_available_size(state) == 12
    state, verify = S.alloc(state, 6)
    assert verify.tolist() == draft.tolist()
    branch_state, _ = S.alloc(saved, 2)  # a sibling branch remaps pages `state` owns
    with pytest.raises(StaleAllocatorStateError):
        S.free(state, verify)
    latest = S.free(branch_state, kept)  # any free makes every older state stale
    with pytest.raises(StaleAllocatorStateError):
        S.alloc(saved, 1)
    assert S.full_available_size(latest) == 32 - 2  # the branch keeps one page; kept is back


def test_paged_swa_extend_maps_new_pages_only() -> None:
    state = S.make_swa_allocator(8, 8, 4)
    state, first = S.alloc_extend(state, np.array([0]), np.array([3]), np.array([-1]))
    state, more = S.alloc_extend(state, np.array([3]), np.array([6]), np.array([first[-1]]))
    slots = np.concatenate([first, more])
    swa = S.swa_slots_of(state, slots)
    assert np.array_equal(swa % 4, np.arange(6) % 4)
    assert len(set((swa // 4).tolist())) == 2 and S.swa_available_size(state) == 24
    with pytest.raises(Exception, match="last_locs"):
        E.plan_extend(state.full, np.array([6]), np.array([7]), np.array([first[0]]))


@settings(max_examples=40, deadline=None)
@given(page_size=st.sampled_from([1, 2, 4]), data=st.data())
def test_swa_extend_decode_map_every_new_page_to_a_fresh_swa_page(page_size: int, data) -> None:
    p = page_size
    state = S.make_swa_allocator(8, 6, p)
    reqs: list[list[int]] = [[], []]
    for _ in range(data.draw(st.integers(1, 12))):
        r = data.draw(st.integers(0, 1))
        pre = len(reqs[r])
        n = data.draw(st.integers(1, 2 * p)) if not reqs[r] or data.draw(st.booleans()) else 1
        last = np.array([reqs[r][-1] if reqs[r] else -1])
        if n == 1 and reqs[r]:
            result = S.alloc_decode(state, np.array([pre + 1]), last)
        else:
            result = S.alloc_extend(state, np.array([pre]), np.array([pre + n]), last)
        if isinstance(result, OutOfSlots):
            need = -(-(pre + n) // p) - (-(-pre // p))
            assert need > min(S.full_available_size(state), S.swa_available_size(state)) // p
            continue
        state, slots = result
        reqs[r] += slots.tolist()
        all_full = np.array(reqs[0] + reqs[1])
        swa = S.swa_slots_of(state, all_full)
        assert np.array_equal(swa % p, all_full % p) and (swa > 0).all()
        full_pages, swa_pages = all_full // p, swa // p
        pairs = set(zip(full_pages.tolist(), swa_pages.tolist(), strict=True))
        assert len(pairs) == len(set(full_pages.tolist())) == len(set(swa_pages.tolist()))  # a bijection
        for req in reqs:  # position j at offset j % P, like the full side
            assert np.array_equal(np.asarray(req, dtype=np.int64) % p, np.arange(len(req)) % p)
        assert S.swa_available_size(state) == (6 - len(set(swa_pages.tolist()))) * p
