"""The scheduler and `PlainStepper` against a brute-force generator, with a fake runner instead of a model.

`FakeRunner` is a model whose "KV" is the token itself: a step writes each fed token into a numpy pool at
the slot the step's metadata names (and into the SWA pool for a hybrid cache), then for every sampling
row reads the sequence's whole context back through its page table (and the sliding window through the
SWA page table) and emits `next_token(context)`, a hash of the context. A token the step takes from the
previous step's samples (`prev_rows`, the overlap schedule) is read from the previous dispatch, as the
device does. So the emitted tokens are right only if every slot the cache, the scheduler and the step
builder hand out holds what it should: a prefix match on the wrong slots, a chunk written to the wrong
page, an SWA page freed inside the window, a retraction that loses a token or an overlap that feeds a
stale one all change the output.

The brute-force reference generates each request alone (`reference`). Hypothesis draws arrivals over
time (prompts sharing stems, so the radix cache matches and evicts), chunk budgets, pool sizes small
enough to force eviction and retraction, aborts at any step, page sizes 1 and 4, plain and hybrid pools,
overlap on and off. Every step the pool's ownership invariants are checked; at the end nothing leaks.
Milliseconds per example: no model, no compile.

`jaxserve.bench.fuzz` drives the `Scheduler` alone and checks each read against its own record of what
every slot should hold. This test goes through the parts it leaves out: `PlainStepper`'s overlap schedule,
`build_step_input` (token packing, `prev_rows`, write slots, page tables, the SWA window's first page) and
the attention metadata, with a model whose output depends on the context it reads.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxserve.engine.kv_cache import KVCache
from jaxserve.engine.request import Status, make_request
from jaxserve.engine.step_input import Buckets, StepInput
from jaxserve.engine.stepper import PlainStepper
from jaxserve.sampling import SampleOutput, SamplingParams
from jaxserve.sampling.params import MAX_TOP_LOGPROBS
from tests.engine.test_page_ids_many import tiny_config

VOCAB = 16  # tiny_config's vocabulary
EOS = 1
WINDOW = 4  # tiny_config's sliding window (hybrid): a query sees itself and the 3 keys before it


def next_token(context: np.ndarray) -> int:
    """The fake model: a hash of the whole context (position-weighted, so order matters)."""
    h = 0
    for t in context.tolist():
        h = (h * 1_000_003 + int(t) + 7) % 2_147_483_647
    return h % VOCAB


def reference(prompt: np.ndarray, max_new_tokens: int, eos: int | None = EOS) -> list[int]:
    """What a request must output, generated alone: greedy `next_token` until `eos` or the length cap."""
    ctx, out = list(prompt.tolist()), []
    while len(out) < max_new_tokens:
        out.append(next_token(np.asarray(ctx)))
        ctx.append(out[-1])
        if out[-1] == eos:
            break
    return out


class FakeRunner:
    """The part of `ModelRunner` that `PlainStepper` calls, over numpy pools (see the module docstring)."""

    def __init__(self, kv: KVCache) -> None:
        self.kv = kv
        self.full = np.full((kv.num_pages + 1) * kv.page_size, -1, np.int64)  # page 0: the padding page
        self.swa = np.full((kv.swa_num_pages + 1) * kv.page_size, -1, np.int64) if kv.hybrid else None
        self.prev = np.zeros(0, np.int64)  # the previous dispatch's samples (the device's `_last_tokens`)

    def set_penalty_row(self, row: int, prompt_ids: np.ndarray, output_ids: list[int]) -> None:
        raise AssertionError("no request here uses penalties")

    def run_with_prompt_logprobs(self, inp: StepInput, next_ids: np.ndarray):
        raise AssertionError("no request here asks for prompt logprobs")

    def run(self, inp: StepInput) -> SampleOutput:
        meta, p = inp.meta, self.kv.page_size
        tokens = np.asarray(inp.input_ids, np.int64).copy()
        prev_rows = np.asarray(inp.prev_rows)
        taken = prev_rows >= 0
        tokens[taken] = self.prev[prev_rows[taken]]
        # padding tokens write to slot 0 (the reserved page), which no real sequence reads
        self.full[np.asarray(meta.write_slots)] = tokens
        if self.swa is not None:
            self.swa[np.asarray(meta.swa_write_slots)] = tokens
        kv_lens, table = np.asarray(meta.kv_lens), np.asarray(meta.page_table)
        out = np.zeros(meta.num_seqs, np.int64)
        for s in np.flatnonzero(kv_lens):
            n = int(kv_lens[s])
            pos = np.arange(n)
            context = self.full[table[s, pos // p] * p + pos % p]
            assert (context >= 0).all(), f"row {s}: context reads unwritten slots: {context.tolist()}"
            if self.swa is not None:  # the last query's window, read through the SWA group
                lo = max(n - WINDOW, 0)  # the window counts the query itself
                swa_table = np.asarray(meta.swa_page_table)
                window = self.swa[swa_table[s, pos[lo:] // p] * p + pos[lo:] % p]
                assert (window == context[lo:]).all(), \
                    f"row {s}: SWA window {window.tolist()} != full context tail {context[lo:].tolist()}"
            out[s] = next_token(context)
        self.prev = out
        rows = meta.num_seqs
        return SampleOutput(out.astype(np.int32), np.zeros(rows, np.float32),
                            np.zeros((rows, MAX_TOP_LOGPROBS), np.int32),
                            np.zeros((rows, MAX_TOP_LOGPROBS), np.float32))


_KV: dict[tuple, KVCache] = {}


def fresh_kv(hybrid: bool, page_size: int, num_pages: int, radix: bool) -> KVCache:
    """One KVCache per shape (its pool arrays are built once); `flush` at the end of every example both
    proves no slot leaked and restarts the allocator as a new engine's."""
    key = (hybrid, page_size, num_pages, radix)
    if key not in _KV:
        _KV[key] = KVCache(tiny_config(hybrid), num_pages=num_pages, page_size=page_size,
                           kv_dtype=jnp.float32, disable_radix_cache=not radix,
                           swa_num_pages=num_pages if hybrid else None)
    return _KV[key]


STEMS = [np.array(s, np.int32) for s in ([2, 3, 4, 5, 6, 7, 8, 9], [2, 3, 4, 10, 11], [12, 13])]

requests = st.lists(st.tuples(
    st.integers(0, 12),  # arrival step
    st.integers(0, len(STEMS)),  # stem (len(STEMS): none)
    st.lists(st.integers(2, VOCAB - 1), max_size=9),  # suffix
    st.integers(1, 24),  # max_new_tokens
    st.one_of(st.none(), st.integers(0, 40)),  # abort at this step (None: never)
), min_size=1, max_size=7)


@settings(max_examples=50, deadline=None)
@given(reqs=requests, hybrid=st.booleans(), page_size=st.sampled_from([1, 4]),
       pool_tokens=st.sampled_from([32, 48, 160]), max_tokens=st.sampled_from([4, 16, 64]),
       max_running=st.integers(1, 5), overlap=st.booleans(), radix=st.booleans())
def test_outputs_equal_each_request_generated_alone(reqs, hybrid, page_size, pool_tokens, max_tokens,
                                                    max_running, overlap, radix):
    kv = fresh_kv(hybrid, page_size, pool_tokens // page_size, radix)
    runner = FakeRunner(kv)
    buckets = Buckets.for_limits(max_tokens=max_tokens, max_seqs=max_running,
                                 max_pages=kv.pages_for(kv.max_request_tokens), page_size=page_size)
    stepper = PlainStepper(kv, runner, buckets, max_tokens=max_tokens, max_running=max_running,
                           overlap=overlap)
    sched = stepper.scheduler
    live = []
    for i, (arrival, stem, suffix, max_new, abort_at) in enumerate(reqs):
        prompt = np.concatenate([STEMS[stem] if stem < len(STEMS) else np.zeros(0, np.int32),
                                 np.asarray(suffix, np.int32)]).astype(np.int32)
        if prompt.shape[0] == 0 or not kv.fits_alone(prompt.shape[0] + max_new):
            continue  # Engine.submit refuses these before the scheduler sees them
        req = make_request(f"r{i}", prompt, SamplingParams(max_new_tokens=max_new, temperature=0.0),
                           tree_root=kv.tree.root, seed=0, eos_token_ids=(EOS,))
        live.append((arrival, abort_at, req))

    step = 0
    while step < 400:
        for arrival, abort_at, req in live:
            if arrival == step:
                sched.add(req)
            if abort_at == step and arrival <= step:
                sched.abort(req)
                stepper.forget(req)
        stepper.step()
        kv.check([r.cached for r in sched.running])
        step += 1
        if stepper.idle and all(arrival < step for arrival, _, _ in live):
            break
    assert stepper.idle, f"not idle after {step} steps"

    for _, _, req in live:
        want = reference(req.prompt_ids, req.max_new_tokens)
        got = list(req.output_ids)
        if req.status is Status.ABORTED:
            assert got == want[: len(got)], f"{req.rid} (aborted): {got} is not a prefix of {want}"
        else:
            assert req.status is Status.FINISHED, f"{req.rid}: {req.status}"
            assert got == want, f"{req.rid}: {got} != {want} (retractions {req.num_retractions})"
    kv.check([])
    kv.flush()  # raises if any slot is still owned once the tree's are freed


def test_fake_runner_sees_a_corrupted_slot():
    """The harness can fail: change one cached token's slot behind the cache's back and a request that
    matches the prefix outputs something else."""
    kv = fresh_kv(False, 1, 64, True)
    runner = FakeRunner(kv)
    buckets = Buckets.for_limits(max_tokens=16, max_seqs=2, max_pages=64, page_size=1)
    stepper = PlainStepper(kv, runner, buckets, max_tokens=16, max_running=2, overlap=True)
    prompt = np.array([2, 3, 4, 5, 6, 7, 8, 9, 10, 11], np.int32)
    outputs = []
    for corrupt in (False, True):
        req = make_request(f"r{corrupt}", prompt, SamplingParams(max_new_tokens=4, temperature=0.0,
                                                                 ignore_eos=True),
                           tree_root=kv.tree.root, seed=0)
        if corrupt:
            slot = int(kv.tree.match_prefix(prompt).slots[3])
            runner.full[slot] = (runner.full[slot] + 1) % VOCAB
        stepper.scheduler.add(req)
        while not stepper.idle:
            stepper.step()
        outputs.append(list(req.output_ids))
    assert req.cached_tokens == prompt.shape[0] - 1  # the second request did read the cached prefix
    assert outputs[0] == reference(prompt, 4, eos=None) != outputs[1]
    kv.flush()
