"""The engine on each Pallas kernel (interpret mode on CPU) produces `native`'s greedy tokens.

Two targets, each with an EAGLE-3 head drafting chains (3 steps) and trees (top-2 branches, 4 draft tokens):
- the embedded gpt-oss (sliding window 32 on half the layers, sinks, MoE) with its trained head;
- the speculative tests' tiny Llama (`spec_pairs`, full attention) with its copy head.
Prefill chunks, radix-cache hits (the second batch shares the first prompt's prefix), chain and tree
verification (the tree under the custom mask) and the draft head's own attention all run on the kernel.
Page size 16; the prompts cross the window and several 16-token chunks. The reference is the plain
(non-speculative) engine on `native`, run once per target: speculative decoding is lossless, so every
chain and tree run must reproduce native's greedy tokens. Each run must accept some drafts and hit the
cache, so a kernel bug on the verify or cached-prefix path cannot hide behind a case that never reaches it.
"""

import functools

import pytest

from jaxserve.api import Engine
from jaxserve.assets import EMBEDDED_DRAFT_DIR, EMBEDDED_MODEL_DIR
from jaxserve.loader.load import load_model
from jaxserve.speculative.eagle3_checkpoint import load_eagle3_draft
from tests.engine.conftest import prompts, small_buckets
from tests.speculative import spec_pairs as sp

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

GREEDY = {"temperature": 0.0, "max_new_tokens": 6, "ignore_eos": True}
DRAFTING = {"chain": dict(speculative_num_steps=3),
            "tree": dict(speculative_num_steps=2, speculative_eagle_topk=2, speculative_num_draft_tokens=4)}
PAGE_SIZE, CHUNK, MAX_RUNNING = 16, 16, 4  # one token bucket (16): each engine compiles each program once


@functools.cache
def _gpt_oss(backend: str):
    """The embedded gpt-oss and its EAGLE-3 head, both attending on `backend` (one pair per backend: the
    chain and tree engines share its compiled steps)."""
    draft = load_eagle3_draft(EMBEDDED_DRAFT_DIR, target_num_layers=4, backend=backend)
    model = load_model(EMBEDDED_MODEL_DIR, progress=False, backend=backend,
                       aux_hidden_state_layer_ids=tuple(draft.config.aux_layer_ids))
    return model, draft


def _engine(kind: str, drafting: str | None, backend: str) -> Engine:
    """The engine over `kind`'s target on `backend`: speculative with `drafting`, plain when None."""
    if kind == "llama":
        if drafting is None:
            return sp.engine("llama", which=None, backend=backend, page_size=PAGE_SIZE, chunk=CHUNK,
                             max_running=MAX_RUNNING)
        spec = dict(DRAFTING[drafting])
        return sp.engine("llama", backend=backend, page_size=PAGE_SIZE, chunk=CHUNK, max_running=MAX_RUNNING,
                         num_steps=spec.pop("speculative_num_steps"), **spec)
    model, draft = _gpt_oss(backend)
    spec = {} if drafting is None else dict(draft_model=draft, speculative_algorithm="EAGLE3",
                                             **DRAFTING[drafting])
    return Engine(model=model, page_size=PAGE_SIZE, max_total_tokens=1024, chunked_prefill_size=CHUNK,
                  max_running_requests=MAX_RUNNING,
                  buckets=small_buckets(max_tokens=CHUNK, max_seqs=MAX_RUNNING, max_pages=64), **spec)


def _outputs(kind: str, drafting: str | None, backend: str) -> list[dict]:
    engine = _engine(kind, drafting, backend)
    assert engine.model.layers[0].attn.cfg.backend == backend
    shared = prompts(5, [40])[0]
    first, *rest = [shared + p for p in prompts(6, [7, 50])] + prompts(7, [33])
    outs = []
    for batch in ([first], rest):  # the second batch's first prompt hits the first one's cached prefix
        outs += engine.generate(input_ids=batch, sampling_params=GREEDY)
    return outs


_native_outputs = functools.cache(lambda kind: _outputs(kind, None, "native"))


@pytest.mark.parametrize("backend", ["pallas_gpu", "pallas_tpu"])
@pytest.mark.parametrize(("kind", "drafting"), [("gpt_oss", "tree"), ("gpt_oss", "chain"), ("llama", "tree"),
                                                ("llama", "chain")])
def test_engine_greedy_tokens_equal_native_with_eagle3(kind, drafting, backend):
    want = [o["output_ids"] for o in _native_outputs(kind)]
    got = _outputs(kind, drafting, backend)
    assert [o["output_ids"] for o in got] == want
    assert all(len(o["output_ids"]) == GREEDY["max_new_tokens"] for o in got)
    assert got[1]["meta_info"]["cached_tokens"] >= PAGE_SIZE  # radix hit on the shared prefix
    assert sum(sum(o["meta_info"]["spec_accept_lengths"]) for o in got) > 0  # some drafts accepted
