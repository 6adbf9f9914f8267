"""Speculative decoding under memory pressure: a tiny pool forces tree eviction and retraction (still
lossless), aborts free their KV, nothing leaks (every slot is back after flush), and each jitted piece
compiles a bounded number of shapes."""

from __future__ import annotations

import numpy as np
import pytest

from tests.speculative import spec_pairs as sp

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

GREEDY = {"temperature": 0}


@pytest.mark.parametrize(("kind", "page_size"), [(k, p) for k in ("llama", "gpt_oss") for p in (1, 16)])
def test_tiny_pool_evicts_and_retracts_losslessly(kind, page_size):
    prompts = sp.shared_prefix_prompts(seed=21, n=8)
    params = {**GREEDY, "max_new_tokens": 28}
    ref = sp.plain_outputs(kind, prompts, params, disable_radix_cache=True)
    engine = sp.engine(kind, page_size=page_size, max_total_tokens=160)
    outs = engine.generate(input_ids=prompts[:4], sampling_params=params)
    outs += engine.generate(input_ids=prompts[4:], sampling_params=params)
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in ref]
    assert engine.scheduler.num_retractions > 0  # the pool was short, not just tight
    engine.check_memory()
    engine.flush_cache()


def test_aborts_mid_decode_free_their_kv_and_the_rest_is_unchanged():
    prompts = sp.shared_prefix_prompts(seed=5, n=6)
    params = {**GREEDY, "max_new_tokens": 30}
    ref = sp.plain_outputs("llama", prompts, params)
    engine = sp.engine("llama", max_total_tokens=512)
    rids = [engine.submit(input_ids=p, sampling_params=params) for p in prompts]
    for _ in range(4):  # a prefill step, then decode rounds
        engine.step()
    engine.abort(rids[1])
    engine.abort(rids[4])
    engine.check_memory()
    engine.run_until_idle()
    for i, rid in enumerate(rids):
        out = engine.output(rid)
        if i in (1, 4):
            assert out["meta_info"]["finish_reason"]["type"] == "abort"
            assert out["output_ids"] == ref[i]["output_ids"][: len(out["output_ids"])]
        else:
            assert out["output_ids"] == ref[i]["output_ids"]
    assert not engine.stepper.rows  # no draft state left behind
    engine.check_memory()
    engine.flush_cache()
    assert engine.kv.available_slots() == engine.kv.num_slots


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_compilations_are_bounded_by_the_buckets(tree):
    # num_steps=4 (topk 1 and 2) is used by no other test: the jitted pieces (cached per graph pair, chain
    # length and branching) are fresh, so their cache sizes count this engine's shapes only. Mixed greedy,
    # sampled and penalised requests: sampling parameters are data, never shapes.
    extra = dict(speculative_eagle_topk=2, speculative_num_draft_tokens=6) if tree else {}
    engine = sp.engine("llama", page_size=16, max_running=4, chunk=32, num_steps=4, **extra)
    rng = np.random.RandomState(2)
    kinds = [GREEDY, {"temperature": 0.8, "top_p": 0.9}, {**GREEDY, "frequency_penalty": 0.5}]
    for i in range(4):
        prompts = [rng.randint(0, 256, size=rng.randint(2, 40)).tolist() for _ in range(rng.randint(1, 5))]
        max_new = int(rng.randint(1, 30))
        params = [{**kinds[(i + j) % 3], "max_new_tokens": max_new} for j in range(len(prompts))]
        engine.generate(input_ids=prompts, sampling_params=params)
    b, w = engine.buckets, engine.stepper
    compiles = w.num_compiles
    pages = len(w.page_buckets)
    assert compiles["prefill"] <= len(b.tokens) * len(b.seqs) * pages
    per_round = len(w.seq_buckets) * pages
    if tree:
        assert compiles["chain_round"] == 0
        assert 1 <= compiles["tree_round"] <= per_round, compiles
    else:
        assert 1 <= compiles["chain_round"] <= per_round, compiles
    engine.check_memory()
    engine.flush_cache()


def test_last_prefill_chunk_of_one_token_and_tree_drafting_under_retraction():
    """A prompt one token longer than the step budget ends its prefill with a 1-token chunk (still a prefill:
    it samples); and tree drafting in a tiny pool retracts and stays lossless."""
    rng = np.random.RandomState(8)
    prompts = [rng.randint(0, 256, size=n).tolist() for n in (17, 33, 5)]
    params = {**GREEDY, "max_new_tokens": 20}
    ref = sp.plain_outputs("llama", prompts, params, chunk=16)
    outs = sp.engine("llama", chunk=16).generate(input_ids=prompts, sampling_params=params)
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in ref]
    prompts = sp.shared_prefix_prompts(seed=4, n=5)
    params = {**GREEDY, "max_new_tokens": 25}
    ref = sp.plain_outputs("llama", prompts, params)
    engine = sp.engine("llama", page_size=16, num_steps=1, speculative_eagle_topk=3,
                       speculative_num_draft_tokens=4, max_total_tokens=160)
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in ref]
    assert engine.scheduler.num_retractions > 0
    engine.check_memory()
    engine.flush_cache()


@pytest.mark.parametrize("mode", ["chain", "chain-overlap", "tree", "tree-overlap"])
def test_device_reads_per_round(mode, monkeypatch):
    """The steppers read results through `host_read.to_host`; any other read (int(), device_get, an
    explicit `__array__`) goes through `ArrayImpl._value`: both are counted. A chain round or tree round
    reads only its verdict (4 arrays, in one `to_host`).
    Overlapped (chains and trees alike), a step dispatches its round and reads the previous one's verdict,
    and the prefill stays in flight: the prefill step reads nothing, the first decode step reads the
    prefill's samples (a round needs them on the host) and no verdict, the last step (nothing left to
    decode) reads the final verdict."""
    from jax._src import array as jax_array

    from jaxserve.engine import host_read

    tree = dict(speculative_eagle_topk=2, speculative_num_draft_tokens=4)
    extra = {"chain": dict(disable_overlap_schedule=True), "chain-overlap": {},
             "tree": dict(tree, disable_overlap_schedule=True), "tree-overlap": tree}[mode]
    engine = sp.engine("llama", num_steps=2, **extra)
    prompts = sp.shared_prefix_prompts(seed=9, n=3)
    engine.generate(input_ids=prompts, sampling_params={**GREEDY, "max_new_tokens": 8})  # compile
    reads, value = [], jax_array.ArrayImpl._value

    def counted(self):
        reads.append(self.shape)
        return value.fget(self)

    monkeypatch.setattr(jax_array.ArrayImpl, "_value", property(counted))
    to_host = host_read.to_host

    def counted_to_host(*arrays):
        reads.extend(a.shape for a in arrays)
        return to_host(*arrays)

    monkeypatch.setattr(host_read, "to_host", counted_to_host)
    rids = [engine.submit(input_ids=p, sampling_params={**GREEDY, "max_new_tokens": 12}) for p in prompts]
    engine.step()  # prefill: the sampled ids and their logprobs (overlapped: read by the next step)
    assert len(reads) == (0 if mode.endswith("overlap") else 2)
    per_step = []
    while not engine.idle:
        reads.clear()
        engine.step()
        per_step.append(len(reads))
    assert len(per_step) >= 3 and all(engine.output(r)["meta_info"]["completion_tokens"] == 12 for r in rids)
    if mode.endswith("overlap"):
        assert per_step[0] == 2 and all(n == 4 for n in per_step[1:]), per_step
    else:
        assert all(n == 4 for n in per_step), per_step
    engine.flush_cache()


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_penalised_requests_survive_retraction(tree):
    """Penalty counts live in the runner's pool rows: a retracted request gets its row back with its output
    counted, so penalised greedy output in a tiny pool (retractions) still equals the plain engine's."""
    prompts = sp.shared_prefix_prompts(seed=31, n=6)
    params = [{**GREEDY, "max_new_tokens": 28, "frequency_penalty": 0.9, "repetition_penalty": 1.3}] * 6
    ref = sp.plain_outputs("llama", prompts, params)
    extra = dict(speculative_eagle_topk=2, speculative_num_draft_tokens=4) if tree else {}
    engine = sp.engine("llama", num_steps=2, max_total_tokens=160, **extra)
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in ref]
    assert engine.scheduler.num_retractions > 0
    engine.check_memory()
    engine.flush_cache()


def test_a_request_filling_the_pool_alone_finishes_under_the_overlapped_schedule():
    """An overlapped round needs two verify spans past the last applied position; a lone request that fits
    the pool with one span only (admission's rule) makes the round fall back to the synchronous schedule
    near the end instead of retracting itself forever."""
    prompt = sp.shared_prefix_prompts(seed=41, n=1)[0]
    total = 160
    params = {**GREEDY, "max_new_tokens": total - len(prompt) - 5, "ignore_eos": True}
    ref = sp.plain_outputs("llama", prompt, params, max_total_tokens=total)
    engine = sp.engine("llama", num_steps=3, max_total_tokens=total)
    out = engine.generate(input_ids=prompt, sampling_params=params)
    assert out["output_ids"] == ref["output_ids"]
    assert out["meta_info"]["completion_tokens"] == params["max_new_tokens"]
    assert engine.scheduler.num_retractions == 0
    engine.check_memory()
    engine.flush_cache()
