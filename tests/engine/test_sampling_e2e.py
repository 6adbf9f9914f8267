"""Sampling parameters end to end: seeds, penalties, logprobs, stop tokens, stop strings, streaming."""

import numpy as np
import pytest

from jaxserve.loader.tokenizer import HFTokenizer
from tests.engine.conftest import hf_greedy, make_engine, prompts
from tests.models.helpers import hf_logits

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

SAMPLED = {"temperature": 0.9, "top_k": 40, "top_p": 0.9, "min_p": 0.01, "max_new_tokens": 16,
           "ignore_eos": True}


@pytest.fixture(scope="module")
def engine(llama):
    _, model, path = llama
    return make_engine(model, tokenizer=HFTokenizer(path))


def test_seeded_sampling_is_independent_of_batch_and_chunking(llama, engine):
    target = prompts(20, [33])[0]
    alone = engine.generate(input_ids=target, sampling_params={**SAMPLED, "seed": 42})["output_ids"]
    others = prompts(21, [50, 7, 21])
    small_chunks = make_engine(llama[1], chunked_prefill_size=16, max_running_requests=4)
    batch = small_chunks.generate(input_ids=[*others[:2], target, others[2]],
                                  sampling_params=[SAMPLED, SAMPLED, {**SAMPLED, "seed": 42}, SAMPLED])
    assert batch[2]["output_ids"] == alone
    other_seed = engine.generate(input_ids=target, sampling_params={**SAMPLED, "seed": 43})["output_ids"]
    assert other_seed != alone


def test_repetition_penalty_equals_transformers(llama, engine):
    hf = llama[0]
    import torch

    for p in prompts(22, [12, 30]):
        ids = torch.tensor([p])
        ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                          repetition_penalty=1.8, eos_token_id=None, pad_token_id=0)[0, len(p):].tolist()
        out = engine.generate(input_ids=p, sampling_params={"temperature": 0, "repetition_penalty": 1.8,
                                                            "max_new_tokens": 12, "ignore_eos": True})
        assert out["output_ids"] == ref
        assert ref != hf_greedy(hf, p, 12)  # the penalty matters on this prompt


def penalised_greedy_reference(hf, prompt, num, frequency, presence):
    """Brute force: full forward per token, OpenAI-style penalties on output counts, argmax."""
    seq, out = list(prompt), []
    for _ in range(num):
        logits = hf_logits(hf, seq)[-1].astype(np.float64)
        counts = np.bincount(out, minlength=logits.shape[0])
        logits -= counts * frequency + (counts > 0) * presence
        out.append(int(np.argmax(logits)))
        seq.append(out[-1])
    return out


def test_frequency_presence_penalties_survive_retraction(llama):
    hf, model, _ = llama
    params = {"temperature": 0, "frequency_penalty": 1.5, "presence_penalty": 0.5, "max_new_tokens": 14,
              "ignore_eos": True}
    batch = prompts(23, [20, 25, 18, 30])
    tiny = make_engine(model, max_total_tokens=96, max_running_requests=4)
    outs = tiny.generate(input_ids=batch, sampling_params=params)
    assert tiny.scheduler.num_retractions > 0
    for p, out in zip(batch, outs, strict=True):
        assert out["output_ids"] == penalised_greedy_reference(hf, p, 14, 1.5, 0.5)


def test_logprobs_are_the_models_log_softmax(llama, engine):
    hf = llama[0]
    p = prompts(24, [15])[0]
    out = engine.generate(input_ids=p, sampling_params={**SAMPLED, "seed": 1, "return_logprob": True,
                                                        "max_new_tokens": 6})
    pairs = out["meta_info"]["output_token_logprobs"]
    logits = hf_logits(hf, p + out["output_ids"]).astype(np.float64)[len(p) - 1: -1]
    log_softmax = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    for step, (logprob, token) in enumerate(pairs):
        assert abs(logprob - log_softmax[step, token]) < 1e-3


def test_stop_token_ids_stop_at_the_first_occurrence(engine):
    p = prompts(25, [20])[0]
    full = engine.generate(input_ids=p, sampling_params={"temperature": 0, "max_new_tokens": 20,
                                                         "ignore_eos": True})["output_ids"]
    stop = full[6]
    out = engine.generate(input_ids=p, sampling_params={"temperature": 0, "max_new_tokens": 20,
                                                        "ignore_eos": True, "stop_token_ids": [stop]})
    first = full.index(stop)
    assert out["output_ids"] == full[: first + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}


def test_stop_strings_trim_the_text(engine):
    text_params = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
    full = engine.generate("The quick brown fox", sampling_params=text_params)
    ascii_at = [i for i, c in enumerate(full["text"]) if i > 0 and c.isascii() and c.isprintable()]
    assert ascii_at, "the random model produced no printable ASCII character; pick another prompt"
    k = ascii_at[0]
    stop = full["text"][k]
    out = engine.generate("The quick brown fox", sampling_params={**text_params, "stop": [stop]})
    assert out["text"] == full["text"][:k]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert full["output_ids"][: len(out["output_ids"])] == out["output_ids"]


def test_streaming_chunks_add_up_to_the_batch_result(engine):
    params = {**SAMPLED, "seed": 5}
    batch = ["Hello there", "Stream me"]
    expected = engine.generate(batch, sampling_params=params)
    texts, ids, finished = ["", ""], [[], []], [None, None]
    for chunk in engine.generate(batch, sampling_params=params, stream=True):
        i = chunk["index"]
        assert finished[i] is None  # nothing after the final chunk
        texts[i] += chunk["text"]
        ids[i] += chunk["output_ids"]
        if chunk["finished"]:
            finished[i] = chunk["meta_info"]
    assert texts == [e["text"] for e in expected]
    assert ids == [e["output_ids"] for e in expected]
    assert [f["completion_tokens"] for f in finished] == [16, 16]


def test_closing_a_stream_early_aborts_its_requests(engine):
    stream = engine.generate(["one", "two"], sampling_params={"max_new_tokens": 40, "ignore_eos": True},
                             stream=True)
    first = next(stream)
    assert first["output_ids"] and not first["finished"]
    stream.close()
    assert not engine.scheduler.running and not engine.scheduler.waiting
    engine.flush_cache()
    assert engine.kv.allocator.available_size() == engine.kv.num_slots
