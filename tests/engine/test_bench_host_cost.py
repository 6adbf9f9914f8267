"""`jaxserve.bench.host_cost`'s host-only side: a `PlainStepper` over `ScriptedRunner` decodes the scripted
token through the real cache and step builder, leaks no slot, and the stepper's host clocks add up."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.bench.host_cost import ScriptedRunner, host_only_ms_per_step
from jaxserve.engine.kv_cache import KVCache
from jaxserve.engine.request import Status, make_request
from jaxserve.engine.step_input import Buckets
from jaxserve.engine.stepper import PlainStepper
from jaxserve.sampling import SamplingParams
from tests.engine.test_page_ids_many import tiny_config


def _stepper(hybrid: bool, page_size: int, num_pages: int) -> tuple[PlainStepper, KVCache]:
    kv = KVCache(tiny_config(hybrid), num_pages=num_pages, page_size=page_size, kv_dtype=jnp.float32,
                 disable_radix_cache=False, swa_num_pages=num_pages if hybrid else None)
    buckets = Buckets.for_limits(max_tokens=64, max_seqs=4, max_pages=kv.pages_for(kv.max_request_tokens),
                                 page_size=page_size)
    return PlainStepper(kv, ScriptedRunner(token=5), buckets, max_tokens=64, max_running=4), kv


@pytest.mark.parametrize("hybrid", [False, True])
def test_scripted_runner_decodes_its_token_through_the_real_stepper(hybrid):
    stepper, kv = _stepper(hybrid, page_size=1, num_pages=256)
    prompt = np.arange(2, 14, dtype=np.int32) % 16
    reqs = [make_request(f"r{i}", np.concatenate([prompt, [i]]).astype(np.int32),
                         SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True),
                         tree_root=kv.tree.root, seed=0) for i in range(3)]
    for req in reqs:
        stepper.scheduler.add(req)
    while not stepper.idle:
        stepper.step()
    assert [r.status for r in reqs] == [Status.FINISHED] * 3
    assert [list(r.output_ids) for r in reqs] == [[5] * 6] * 3
    stats = stepper.stats
    assert stats["host_cpu_s"] > 0 and stats["host_s"] > 0
    kv.flush()  # raises if a slot is still owned


@pytest.mark.parametrize("page_size", [1, 4])
def test_host_only_pass_measures_decode_steps_and_leaves_the_pool_empty(page_size):
    stepper, kv = _stepper(True, page_size=page_size, num_pages=512 // page_size)
    free = kv.available_slots()
    for context in (16, 96):
        ms = host_only_ms_per_step(stepper, kv, 16, context, batch=4, steps=5, seed=1)
        assert ms > 0
        assert stepper.idle and kv.available_slots() == free  # every request finished, the tree flushed
