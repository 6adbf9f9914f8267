"""The OpenAI surface beyond plain chat/completions, with the official `openai` client against the shared
server: lists of prompts, n choices (prefill once, KV shared), logit_bias, logprobs (vs a transformers full
forward of the served checkpoint), /v1/models/{id}, /tokenize, /detokenize, ignored harmless fields."""

from __future__ import annotations

import re

import numpy as np
import openai
import pytest

from tests.server.conftest import assert_kv_baseline, memory
from tests.server.test_openai import chat_ids

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

MESSAGES = [{"role": "user", "content": "Hello server!"}]
BAD = [
    ({"prompt": ["a"] * 65, "n": 4}, "at most 256"),
    ({"prompt": []}, "empty"),
    ({"prompt": "x", "suffix": "y"}, "unknown field 'suffix'"),  # changes the output: still refused
    ({"prompt": "x", "logit_bias": {"1": 200}}, "[-100, 100]"),
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": "x", "n": 3, "best_of": 2}, "best_of=2 must be at least n=3"),
    ({"prompt": "x", "n": 2, "best_of": 3, "stream": True}, "best_of > n cannot be streamed"),
    ({"prompt": ["a"] * 65, "best_of": 4}, "at most 256"),
]


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def hf_model(model_dir):
    """transformers' own implementation of the served checkpoint (float32, eager): the logprob reference."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager", dtype=torch.float32)
    model.config._experts_implementation = "eager"
    return model.eval()


def hf_log_softmax(hf_model, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        logits = hf_model(torch.tensor([ids])).logits[0].double()
    return torch.log_softmax(logits, -1).numpy()


@pytest.mark.parametrize("body,message", BAD, ids=[m for _, m in BAD])
def test_bad_openai_fields_get_a_clear_400(client, body, message):
    r = client.post("/v1/completions", json={"max_tokens": 2, **body})
    assert r.status_code == 400 and message in r.json()["message"], r.text
    assert_kv_baseline(client)


def test_forced_tool_choice_needs_a_model_that_writes_calls(client):
    """The shared model's template writes no `<tool_call>` blocks and it is no harmony model: a call cannot be
    forced, which is a 400 rather than an unconstrained answer."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    r = client.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 2, "tools": [tool],
                                                  "tool_choice": "required"})
    assert r.status_code == 400 and "needs a model that writes tool calls" in r.json()["message"], r.text
    assert_kv_baseline(client)


def test_harmless_fields_are_accepted_and_change_nothing(oai, reference):
    out = oai.completions.create(model="any", prompt="Hello world", max_tokens=6, temperature=0, user="u1",
                                 extra_body={"store": False, "metadata": {"k": "v"}, "service_tier": "auto"})
    assert out.choices[0].text == reference.generate("Hello world", 6)[0]


def test_list_of_prompts_and_n_choices_are_prompt_major(oai, reference, client):
    prompts = ["The quick brown fox", "Hello world"]
    out = oai.completions.create(model="any", prompt=prompts, n=2, max_tokens=5, temperature=0)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    expected = [reference.generate(p, 5)[0] for p in prompts]
    assert [c.text for c in out.choices] == [expected[0], expected[0], expected[1], expected[1]]
    ids = [reference.tokenizer.encode(p) for p in prompts]
    assert out.usage.prompt_tokens == sum(len(i) for i in ids)  # each prompt once
    assert_kv_baseline(client)


def test_seeded_choices_differ_and_repeat(oai):
    kwargs = dict(model="any", prompt="The quick brown fox", n=4, max_tokens=12, temperature=1.0, seed=5)
    a = [c.text for c in oai.completions.create(**kwargs).choices]
    b = [c.text for c in oai.completions.create(**kwargs).choices]
    assert a == b and len(set(a)) > 1  # choice i samples with seed + i


def test_best_of_returns_the_candidates_with_the_highest_mean_logprob(oai):
    """best_of = 4, n = 2 over two prompts: per prompt, the two of the four seeded candidates (the same ones
    n = 4 samples, choice i with seed + i) whose output tokens have the highest mean logprob, best first;
    usage counts all four; logprobs appear only when asked for."""
    kwargs = dict(model="any", prompt=["The quick brown fox", "Hello"], max_tokens=8, temperature=1.0,
                  seed=11)
    every = oai.completions.create(n=4, logprobs=0, **kwargs).choices
    got = oai.completions.create(n=2, best_of=4, **kwargs)
    with_logprobs = oai.completions.create(n=2, best_of=4, logprobs=0, **kwargs).choices
    want, want_means = [], []
    for prompt in range(2):
        candidates = every[4 * prompt: 4 * prompt + 4]
        means = [float(np.mean(c.logprobs.token_logprobs)) for c in candidates]
        # the ranking decides something (and no two candidates are close enough for float noise to swap)
        assert min(np.diff(sorted(means))) > 1e-3
        order = sorted(range(4), key=lambda i: -means[i])[:2]
        want += [candidates[i].text for i in order]
        want_means += [means[i] for i in order]
    assert [c.text for c in got.choices] == want == [c.text for c in with_logprobs]
    assert [c.index for c in got.choices] == [0, 1, 2, 3] and all(c.logprobs is None for c in got.choices)
    np.testing.assert_allclose([np.mean(c.logprobs.token_logprobs) for c in with_logprobs], want_means,
                               atol=1e-5)  # other batch shapes: float noise
    full = oai.completions.create(n=4, **kwargs).usage
    assert (got.usage.completion_tokens, got.usage.prompt_tokens) == (full.completion_tokens,
                                                                       full.prompt_tokens)


def _counter(client, name: str) -> float:
    text = client.get("/metrics").text
    return sum(float(v) for v in re.findall(rf"^\w+:{name}(?:_total)?(?:{{[^}}]*}})? (\S+)$", text, re.M))


def test_n_choices_prefill_the_prompt_once_and_share_its_kv(oai, client, reference):
    """n = 4 on a 1,000-token prompt: prompt tokens computed = prompt_tokens - cached_tokens over the four
    choices is about one prompt, and the KV the tree keeps afterwards is about one prompt, not four."""
    prompt = [int(t) for t in np.random.default_rng(0).integers(3, 1000, 1000)]
    assert client.post("/flush_cache").status_code == 200
    page_size = client.get("/get_server_info").json()["page_size"]
    prompt_before, cached_before = _counter(client, "prompt_tokens"), _counter(client, "cached_tokens")
    out = oai.completions.create(model="any", prompt=prompt, n=4, max_tokens=4, temperature=0)
    texts = {c.text for c in out.choices}
    assert texts == {reference.generate(prompt, 4)[0]}
    computed = (_counter(client, "prompt_tokens") - prompt_before) - (_counter(client, "cached_tokens")
                                                                       - cached_before)
    held = memory(client)["evictable_slots"]  # everything the four requests cached, after they finished
    print(f"n=4 on 1,000 tokens: {computed:.0f} prompt tokens computed, {held} KV slots kept")
    assert 1000 <= computed <= 1000 + 3 * page_size, computed
    assert held <= 1000 + 4 * 2 * page_size, held
    assert_kv_baseline(client)


def test_logit_bias_forces_a_token(oai, reference):
    token = reference.tokenizer.encode(" fox")[-1]
    out = oai.completions.create(model="any", prompt="Hello", max_tokens=4, temperature=0,
                                 logit_bias={str(token): 100}, extra_body={"ignore_eos": True})
    assert out.choices[0].text == reference.tokenizer.decode([token] * 4)
    assert out.usage.completion_tokens == 4


def test_completion_logprobs_match_a_full_forward(oai, reference, hf_model):
    prompt = "The quick brown fox"
    out = oai.completions.create(model="any", prompt=prompt, max_tokens=6, temperature=0, logprobs=3)
    lp = out.choices[0].logprobs
    prompt_ids = reference.tokenizer.encode(prompt)
    _, output_ids = reference.generate(prompt, 6)
    ref = hf_log_softmax(hf_model, prompt_ids + output_ids[:-1])[len(prompt_ids) - 1:]
    np.testing.assert_allclose(lp.token_logprobs, ref[np.arange(len(output_ids)), output_ids], atol=2e-3)
    for step, top in enumerate(lp.top_logprobs):
        assert len(top) == 3
        best = np.sort(ref[step])[::-1][:3]
        np.testing.assert_allclose(sorted(top.values(), reverse=True), best, atol=2e-3)
    assert lp.text_offset[0] == 0 and "".join(lp.tokens).startswith(out.choices[0].text)


def test_chat_logprobs_streamed_equal_the_whole_answer(oai, hf_model, reference, model_dir):
    kwargs = dict(model="any", messages=MESSAGES, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2)
    whole = oai.chat.completions.create(**kwargs).choices[0].logprobs.content
    chunks = list(oai.chat.completions.create(**kwargs, stream=True))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in whole]
    assert all(len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob >= e.logprob - 1e-6 for e in whole)
    prompt = chat_ids(reference, model_dir, MESSAGES)
    _, ids = reference.generate(prompt, 8)
    texts = [reference.tokenizer.decode([i], skip_special_tokens=False) for i in ids]
    assert [e.token for e in whole] == texts
    ref = hf_log_softmax(hf_model, prompt + ids[:-1])[len(prompt) - 1:]
    np.testing.assert_allclose([e.logprob for e in whole], ref[np.arange(len(ids)), ids], atol=2e-3)


def test_models_tokenize_detokenize(oai, client, reference):
    name = oai.models.list().data[0].id
    assert oai.models.retrieve(name).id == name
    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve("no-such-model")
    r = client.post("/tokenize", json={"prompt": "Hello world"}).json()
    assert r["tokens"] == reference.tokenizer.encode("Hello world") and r["count"] == len(r["tokens"])
    assert client.post("/detokenize", json={"tokens": r["tokens"]}).json()["text"] == "Hello world"
    bad = client.post("/detokenize", json={"tokens": [10**9]})
    assert bad.status_code == 400 and "outside the vocabulary" in bad.json()["message"]


def test_health_generate_runs_one_token(client):
    assert client.get("/health_generate").status_code == 200
    assert_kv_baseline(client)


def test_generate_with_n_returns_n_results_per_prompt(client, reference):
    """SGLang's /generate: `n` in sampling_params gives n results per prompt, prompt-major; the forks reuse
    the prompt's cached prefix."""
    prompts = ["The quick brown fox jumps over the lazy dog and then", "Hello world"]
    r = client.post("/generate", json={"text": prompts, "sampling_params": {"n": 3, "temperature": 0,
                                                                            "max_new_tokens": 5}})
    assert r.status_code == 200, r.text
    out = r.json()
    assert [o["text"] for o in out] == [reference.generate(p, 5)[0] for p in prompts for _ in range(3)]
    long_prompt = len(reference.tokenizer.encode(prompts[0]))
    assert all(o["meta_info"]["cached_tokens"] >= long_prompt - 16 for o in out[1:3])
    one = client.post("/generate", json={"text": "Hello", "sampling_params": {"n": 2, "max_new_tokens": 2}})
    assert isinstance(one.json(), list) and len(one.json()) == 2
    assert_kv_baseline(client)


def test_echo_prepends_the_prompt_plain_and_streamed(oai, reference):
    text, _ = reference.generate("Hello world", 5)
    out = oai.completions.create(model="any", prompt="Hello world", max_tokens=5, temperature=0, echo=True)
    assert out.choices[0].text == "Hello world" + text
    ids = reference.tokenizer.encode("The quick")
    stream = oai.completions.create(model="any", prompt=ids, max_tokens=5, temperature=0, echo=True,
                                    stream=True)
    echoed = reference.tokenizer.decode(ids, skip_special_tokens=False)
    assert "".join(c.choices[0].text for c in stream) == echoed + reference.generate(ids, 5)[0]


def test_streamed_choices_are_told_apart_by_index(oai, reference, model_dir):
    stream = oai.chat.completions.create(model="any", messages=MESSAGES, n=3, max_tokens=6, temperature=0,
                                         stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    texts = {i: "".join(c.choices[0].delta.content or "" for c in chunks
                        if c.choices and c.choices[0].index == i) for i in range(3)}
    prompt = chat_ids(reference, model_dir, MESSAGES)
    text, ids = reference.generate(prompt, 6)
    assert texts == {0: text, 1: text, 2: text}
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 3
    usage = chunks[-1].usage
    assert usage.prompt_tokens == len(prompt) and usage.completion_tokens == 3 * len(ids)


def test_echo_with_logprobs_gives_the_prompts_logprobs(oai, reference, hf_model):
    """Prompt logprobs come from the prefill's own logits, also for a prompt the cache already holds."""
    prompt = "The quick brown fox jumps over the lazy dog"
    oai.completions.create(model="any", prompt=prompt, max_tokens=2, temperature=0)  # now cached
    out = oai.completions.create(model="any", prompt=prompt, max_tokens=3, temperature=0, echo=True,
                                 logprobs=2)
    lp = out.choices[0].logprobs
    ids = reference.tokenizer.encode(prompt)
    _, output_ids = reference.generate(prompt, 3)
    ref = hf_log_softmax(hf_model, ids + output_ids[:-1])
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    every = ids + output_ids
    np.testing.assert_allclose(lp.token_logprobs[1:], ref[np.arange(len(every) - 1), every[1:]], atol=2e-3)
    assert all(len(t) == 2 for t in lp.top_logprobs[1:])
    assert out.choices[0].text.startswith(prompt)
    stream = list(oai.completions.create(model="any", prompt=prompt, max_tokens=3, temperature=0, echo=True,
                                         logprobs=2, stream=True))
    streamed = [v for c in stream if c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs]
    assert streamed[0] is None and np.allclose(streamed[1:], lp.token_logprobs[1:], atol=1e-5)


def test_generate_reports_sglang_logprob_fields(client, reference, hf_model):
    ids = reference.tokenizer.encode("Hello world, hello")
    r = client.post("/generate", json={"input_ids": ids, "return_logprob": True, "top_logprobs_num": 2,
                                       "logprob_start_len": 0,
                                       "sampling_params": {"temperature": 0, "max_new_tokens": 3}})
    meta = r.json()["meta_info"]
    out = r.json()["output_ids"]
    ref = hf_log_softmax(hf_model, ids + out[:-1])
    assert meta["input_token_logprobs"][0][0] is None
    np.testing.assert_allclose([lp for lp, _ in meta["input_token_logprobs"][1:]],
                               ref[np.arange(len(ids) - 1), ids[1:]], atol=2e-3)
    np.testing.assert_allclose([lp for lp, _ in meta["output_token_logprobs"]],
                               ref[np.arange(len(ids) - 1, len(ids) + 2), out], atol=2e-3)
    assert all(len(top) == 2 for top in meta["output_top_logprobs"])
    bad = client.post("/generate", json={"input_ids": ids, "return_logprob": True, "logprob_start_len": 3})
    assert bad.status_code == 400 and "logprob_start_len" in bad.json()["message"]
