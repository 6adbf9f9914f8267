"""A step whose exact bucket is not compiled runs padded to a larger compiled bucket while its own compiles
in the background (`runner.Programs`), for the plain step and for EAGLE-3's prefill and round programs
(chain and tree). Reference: the same requests on the same engine once every exact program is compiled.
Greedy tokens are equal; logprobs agree to 1e-5 (XLA's CPU kernels are chosen per shape: a padded step can
round a logprob's last bit differently). No program is compiled twice. The background thread is held back
until the padded run is over, so the padding really happens."""

from __future__ import annotations

import threading

import jax
import numpy as np
import pytest

from jaxserve.api import Engine
from jaxserve.engine import runner
from jaxserve.engine.program_cache import release_unused_programs
from jaxserve.engine.runner import Programs
from jaxserve.engine.step_input import Buckets
from tests.speculative import spec_pairs as sp

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it


@pytest.fixture
def held_back(monkeypatch):
    """Background compiles wait while the returned event is clear; fresh program caches for this test."""
    gate = threading.Event()
    compile_ = Programs._compile

    def held(self, program):
        if threading.current_thread().name.startswith("compile-"):
            gate.wait()
        compile_(self, program)

    monkeypatch.setattr(Programs, "_compile", held)
    runner.enable_background_compiles()
    release_unused_programs()
    yield gate
    gate.set()
    runner.enable_background_compiles(False)
    release_unused_programs()


def _programs(engine) -> list[Programs]:
    fns = [engine.runner._step]
    if hasattr(engine.stepper, "_fns"):
        fns += list(engine.stepper._fns(False))
    return fns


def _run(engine, prompts):
    params = [{"temperature": 0, "max_new_tokens": 12, "ignore_eos": True, "return_logprob": True}
              for _ in prompts]
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    engine.flush_cache()
    return [o["output_ids"] for o in outs], [[lp for lp, _ in o["meta_info"]["output_token_logprobs"]]
                                            for o in outs]


@pytest.mark.parametrize(("which", "tree"), [(None, False), ("copy", False), ("copy", True)],
                         ids=["plain", "eagle_chain", "eagle_tree"])
def test_padded_steps_sample_what_exact_buckets_sample(held_back, which, tree):
    spec = {} if which is None else dict(draft_model=sp.draft("gpt_oss", which),
                                         speculative_algorithm="EAGLE3", speculative_num_steps=3,
                                         speculative_policy="always")
    if tree:
        spec.update(speculative_eagle_topk=2, speculative_num_draft_tokens=5)
    engine = Engine(model=sp.target("gpt_oss"), page_size=4, max_total_tokens=512, chunked_prefill_size=32,
                    max_running_requests=4, buckets=Buckets((16, 32), (2, 4), (16, 128)), **spec)
    held_back.set()
    for programs, bucket, args in engine.stepper.warm_plan()[:2 if which else 1]:  # the largest ones
        programs.prepare(bucket, args)
    for programs in _programs(engine):
        [p.done.wait() for p in programs._programs.values()]
    held_back.clear()
    largest = {p.name: p.num_compiles for p in _programs(engine)}
    rng = np.random.RandomState(3)
    prompts = [rng.randint(1, 256, size=n).tolist() for n in (3, 11, 6)]
    pools = jax.tree.leaves(engine.kv.pools)
    padded_ids, padded_lps = _run(engine, prompts)
    assert all(x.is_deleted() for x in pools)  # donated through the padded programs too
    padded = sum(p.num_padded for p in _programs(engine))
    assert padded > 0
    held_back.set()
    for programs in _programs(engine):
        [p.done.wait() for p in programs._programs.values()]
    compiles = engine.num_compiles
    assert sum(compiles.values()) > sum(largest.values())
    exact_ids, exact_lps = _run(engine, prompts)
    assert sum(p.num_padded for p in _programs(engine)) == padded  # the second run used exact buckets only
    assert engine.num_compiles == compiles
    assert padded_ids == exact_ids
    for a, b in zip(padded_lps, exact_lps, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    engine.check_memory()
