"""Constrained decoding under the overlap schedule (the step cut into forward and sampler programs,
`engine.split_step`) against the synchronous constrained path (`disable_overlap_schedule`, each step
applied as dispatched, the fused step): the same outputs for several grammars, alone and mixed with
unconstrained requests, greedy and seeded; grammars stay data (no program per grammar)."""

from __future__ import annotations

import json
import re

import pytest

from jaxserve.api import Engine
from jaxserve.assets import EMBEDDED_MODEL_DIR

pytestmark = pytest.mark.slow  # builds engines over the embedded model

FLAGS = dict(page_size=16, max_total_tokens=8192, chunked_prefill_size=64, max_running_requests=8,
             random_seed=0)
PROMPTS = ["The quick brown fox", "Hello", "def main():", "Question: what is the capital of France?"]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[a-z]{1,6}$"},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["n", "name"], "additionalProperties": False}
GRAMMARS = [{"regex": "[a-z ]+"}, {"regex": r"(cat|dog)s?"}, {"ebnf": 'root ::= ("yes" | "no") "!" [0-9]'},
            {"json_schema": json.dumps(SCHEMA)}, {}]  # {}: unconstrained


@pytest.fixture(scope="module")
def engines():
    overlap = Engine(model_path=str(EMBEDDED_MODEL_DIR), **FLAGS)
    sync = Engine(model=overlap.model, tokenizer=overlap.tokenizer, disable_overlap_schedule=True, **FLAGS)
    return overlap, sync


def _texts(engine, prompts, params):
    engine.flush_cache()
    outs = engine.generate(prompts, params)
    return [(o["text"], o["meta_info"]["completion_tokens"], o["meta_info"]["finish_reason"]["type"])
            for o in outs]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_mixed_batch_equals_the_synchronous_path(engines, temperature):
    overlap, sync = engines
    n = 8
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(n)]
    params = [{"temperature": temperature, "seed": i, "max_new_tokens": 24, **GRAMMARS[i % len(GRAMMARS)]}
              for i in range(n)]
    got, want = _texts(overlap, prompts, params), _texts(sync, prompts, params)
    assert got == want
    assert overlap.runner.num_split_compiles > 0  # the split schedule ran
    for (text, _, finish), p in zip(got, params, strict=True):  # and the grammars held
        if "regex" in p and finish == "stop":
            assert re.fullmatch(p["regex"], text), text
        if "json_schema" in p and finish == "stop":
            json.loads(text)


def test_staggered_lengths_and_unconstrained_only_phases(engines):
    """Requests of different lengths finish at different steps, so the batch turns from constrained to
    unconstrained (split and fused steps alternate, with a step in flight across the switch)."""
    overlap, sync = engines
    prompts = PROMPTS * 2
    params = [{"temperature": 0, "max_new_tokens": 4 + 5 * i, "ignore_eos": True,
               **({"regex": "[a-z ]+"} if i % 3 == 0 else {})} for i in range(len(prompts))]
    assert _texts(overlap, prompts, params) == _texts(sync, prompts, params)


def test_penalty_rows_recycled_while_a_sampler_is_held(engines, monkeypatch):
    """More requests than run at once, all with penalties: a request admitted while a split step's sampler
    is held takes the penalty row of one that finished a step before the host knew, and that sampler
    still counts a token into the row. The held sampler must run before the new row is written, or the
    new request starts with a stray count (its output can then differ from the synchronous path's; the
    runner's call order shows the rule held even where the stray count would not change a token)."""
    overlap, sync = engines
    n = 20
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(n)]
    # a grammar that ends ("cats") finishes its request at a step the scheduler could not foresee
    grammars = [{"regex": r"(cat|dog)s?"}, {"regex": "[a-z]{2,5}"}, {"regex": "[a-z ]+"}, {}]
    params = [{"temperature": 0, "max_new_tokens": 3 + (7 * i) % 11, "frequency_penalty": 1.5,
               "presence_penalty": 0.5, **grammars[i % len(grammars)]} for i in range(n)]
    calls = []  # the runner's calls in dispatch order
    for name in ("run_forward", "run_sample", "set_penalty_row"):
        method = getattr(overlap.runner, name)
        monkeypatch.setattr(overlap.runner, name,
                            lambda *a, _m=method, _n=name: calls.append(_n) or _m(*a))
    assert _texts(overlap, prompts, params) == _texts(sync, prompts, params)
    assert calls.count("run_forward") == calls.count("run_sample") > 0
    assert "set_penalty_row" in calls
    pending = 0  # forwards whose sampler has not been dispatched: no penalty row may be written meanwhile
    for name in calls:
        pending += {"run_forward": 1, "run_sample": -1}.get(name, 0)
        assert name != "set_penalty_row" or pending == 0, calls


def test_new_grammars_compile_nothing_new(engines):
    overlap, _ = engines
    # warm with the same mix as below (one request unconstrained), both calls from an empty prefix cache so
    # that their prefills have the same shape: the test then needs no earlier test's programs
    warm = {"max_new_tokens": 6, "regex": "[ab]+"}
    overlap.flush_cache()
    overlap.generate(PROMPTS, [warm, {"max_new_tokens": 6}, warm, warm])
    before = dict(overlap.stepper.num_compiles)
    overlap.flush_cache()
    overlap.generate(PROMPTS, [{"max_new_tokens": 6, "regex": r"[0-9]{2}x"}, {"max_new_tokens": 6},
                               {"max_new_tokens": 6, "ebnf": 'root ::= "a" [0-9]+'},
                               {"max_new_tokens": 6, "json_schema": json.dumps(SCHEMA)}])
    assert overlap.stepper.num_compiles == before
    # bounded: one forward per step bucket and one sampler per sequence bucket at most
    buckets = overlap.buckets
    assert before["split_step"] <= buckets.num_shapes + len(buckets.seqs)


@pytest.mark.xla_optimized
def test_split_programs_donate_the_pools_without_copies(engines):
    """The forward half keeps the donated KV pools in place (no copy of a pool-shaped array in its HLO)
    and the sampler half donates the penalty pool, as the fused step does."""
    import jax
    import jax.numpy as jnp

    from jaxserve.engine import split_step
    from jaxserve.engine.step_input import padding_step_input

    overlap, _ = engines
    r = overlap.runner
    max_seqs = max(overlap.buckets.seqs)
    forward, _ = split_step.split_fns(r.graphdef, max_seqs)
    inp = padding_step_input(r.kv, 16, 1, 4)
    args = (r.params, r.kv.pools, jnp.zeros(max_seqs, jnp.int32), inp.input_ids, inp.prev_rows, inp.meta)
    hlo = forward.lower(*args).compile().as_text()
    pool_leaves = jax.tree.leaves(r.kv.pools)
    dt = {"bfloat16": "u16", "float32": "f32", "float16": "f16"}
    shapes = {f"{dt.get(str(a.dtype), str(a.dtype))}[{','.join(map(str, a.shape))}]" for a in pool_leaves}
    assert any(s in hlo for s in shapes), shapes
    copies = [ln for ln in hlo.splitlines() if re.search(r"copy\(", ln) and any(s in ln for s in shapes)]
    assert not copies, copies[:3]
    before, penalties_before = pool_leaves[0], jax.tree.leaves(r.penalties)[0]
    logits = r.run_forward(inp)
    assert before.is_deleted() and not jax.tree.leaves(r.kv.pools)[0].is_deleted()
    r.run_sample(logits, inp.sampling)
    assert penalties_before.is_deleted() and not jax.tree.leaves(r.penalties)[0].is_deleted()
