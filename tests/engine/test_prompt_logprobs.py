"""Prompt logprobs against transformers' full forward: every prompt position, across prefill chunks, for a
prompt the prefix cache already holds (it is computed again), a retracted request, and the top logprobs."""

from __future__ import annotations

import numpy as np
import pytest

from tests.engine.conftest import make_engine, prompts
from tests.models.helpers import hf_logits

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    logits = logits.astype(np.float64)
    top = logits.max(-1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))


@pytest.fixture(scope="module")
def engine(llama):
    return make_engine(llama[1], page_size=4, chunked_prefill_size=32)


def test_prompt_logprobs_equal_a_full_forward_across_chunks_and_a_cached_prefix(llama, engine):
    p = prompts(31, [90])[0]  # three chunks of at most 32 tokens
    engine.generate(input_ids=p, sampling_params={"max_new_tokens": 1})  # the tree now holds the prompt
    out = engine.generate(input_ids=p, sampling_params={"temperature": 0, "max_new_tokens": 2,
                                                        "prompt_logprobs": True, "top_logprobs_num": 3})
    meta = out["meta_info"]
    assert meta["cached_tokens"] == 0
    ref = _log_softmax(hf_logits(llama[0], p))
    pairs = meta["input_token_logprobs"]
    assert pairs[0] == (None, p[0]) and [t for _, t in pairs] == p
    np.testing.assert_allclose([lp for lp, _ in pairs[1:]], ref[np.arange(89), p[1:]], atol=1e-3)
    for q in (1, 40, 89):
        top = meta["input_top_logprobs"][q]
        assert [t for _, t in top] == np.argsort(-ref[q - 1])[:3].tolist()


def test_retracted_request_keeps_its_prompt_logprobs(llama):
    tiny = make_engine(llama[1], max_total_tokens=96, max_running_requests=4)
    batch = prompts(32, [20, 25, 18, 30])
    params = {"temperature": 0, "max_new_tokens": 14, "ignore_eos": True, "prompt_logprobs": True}
    outs = tiny.generate(input_ids=batch, sampling_params=params)
    assert tiny.scheduler.num_retractions > 0
    for p, out in zip(batch, outs, strict=True):
        ref = _log_softmax(hf_logits(llama[0], p))
        got = [lp for lp, _ in out["meta_info"]["input_token_logprobs"][1:]]
        np.testing.assert_allclose(got, ref[np.arange(len(p) - 1), p[1:]], atol=1e-3)


def test_prompt_logprobs_under_eagle3_equal_a_full_forward():
    """Under EAGLE-3 (the main job's default) the prefill program's all-positions variant gives the prompt
    logprobs: equal to transformers' forward of the embedded checkpoint across prefill chunks, for a prompt
    the prefix cache already holds, with the top logprobs; the completion is the one a request without
    prompt logprobs gets."""
    import torch
    from transformers import AutoModelForCausalLM

    from jaxserve.api import Engine
    from jaxserve.assets import EMBEDDED_MODEL_DIR

    spec = Engine(model_path=str(EMBEDDED_MODEL_DIR), speculative_algorithm="EAGLE3", page_size=4,
                  speculative_draft_model_path=str(EMBEDDED_MODEL_DIR / "draft"), max_total_tokens=2048,
                  chunked_prefill_size=16, max_running_requests=4)
    p = spec.tokenizer.encode("The os module provides a portable way of using operating system dependent "
                              "functionality, such as reading or writing files.")
    assert len(p) > 32  # three chunks at least
    params = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}
    plain = spec.generate(input_ids=p, sampling_params=params)  # the tree now holds the prompt
    wants = {**params, "prompt_logprobs": True, "top_logprobs_num": 3}
    out = spec.generate(input_ids=p, sampling_params=wants)
    meta = out["meta_info"]
    assert meta["cached_tokens"] == 0 and out["output_ids"] == plain["output_ids"]
    hf = AutoModelForCausalLM.from_pretrained(EMBEDDED_MODEL_DIR, attn_implementation="eager",
                                              dtype=torch.float32)
    hf.config._experts_implementation = "eager"
    ref = _log_softmax(hf_logits(hf.eval(), p))
    pairs = meta["input_token_logprobs"]
    assert pairs[0] == (None, p[0]) and [t for _, t in pairs] == p
    np.testing.assert_allclose([lp for lp, _ in pairs[1:]], ref[np.arange(len(p) - 1), p[1:]], atol=2e-3)
    for q in (1, 17, len(p) - 1):
        top = meta["input_top_logprobs"][q]
        assert [t for _, t in top] == np.argsort(-ref[q - 1])[:3].tolist()
    # two prompts in one step, one wanting prompt logprobs: each sequence's positions land in its own row
    short = p[3:24]
    both = spec.generate(input_ids=[short, p], sampling_params=[{**params, "prompt_logprobs": True}, params])
    got = [lp for lp, _ in both[0]["meta_info"]["input_token_logprobs"][1:]]
    ref_short = _log_softmax(hf_logits(hf, short))
    np.testing.assert_allclose(got, ref_short[np.arange(len(short) - 1), short[1:]], atol=2e-3)
    assert both[1]["output_ids"] == plain["output_ids"]
    assert spec.stepper.num_compiles["prefill"] >= 2  # the plain prefill and its prompt-logprobs variant
