"""Bad input never takes the server down: each bad request gets a 4xx JSON error with a clear message, and
afterwards the server still answers /health and its KV cache is back to baseline (no leaked slots)."""

from __future__ import annotations

import httpx
import pytest

from tests.server.conftest import assert_kv_baseline

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

GREEDY = {"temperature": 0, "max_new_tokens": 2}
# (case id, method, path, body, expected status, substring of the message). A body is JSON (dict), raw bytes,
# or a function of the model's facts (vocab_size V, context_length C) returning either; messages may name
# {V} and {C}.
CASES = [
    ("malformed-json", "POST", "/generate", b'{"text": "hi",', 400, "malformed JSON"),
    ("body-not-object", "POST", "/generate", b"[1, 2]", 400, "invalid request"),
    ("text-wrong-type", "POST", "/generate", {"text": 5}, 400, "text"),
    ("ids-wrong-type", "POST", "/generate", {"input_ids": ["a", "b"]}, 400, "input_ids"),
    ("stream-wrong-type", "POST", "/generate", {"text": "hi", "stream": "yes"}, 400, "stream"),
    ("params-wrong-type", "POST", "/generate", {"text": "hi", "sampling_params": "greedy"}, 400,
     "sampling_params"),
    ("unknown-field", "POST", "/generate", {"text": "hi", "foo": 1}, 400, "unknown field 'foo'"),
    ("unknown-sampling-param", "POST", "/generate", {"text": "hi", "sampling_params": {"max_tokens": 3}}, 400,
     "unknown sampling parameter"),
    ("both-inputs", "POST", "/generate", {"text": "hi", "input_ids": [1]}, 400, "exactly one"),
    ("no-input", "POST", "/generate", {"sampling_params": GREEDY}, 400, "exactly one"),
    ("empty-text", "POST", "/generate", {"text": ""}, 400, "empty"),
    ("empty-ids", "POST", "/generate", {"input_ids": []}, 400, "empty"),
    ("empty-batch", "POST", "/generate", {"text": []}, 400, "empty"),
    ("over-long-prompt", "POST", "/generate", lambda f: {"input_ids": [7] * (f["context_length"] + 40)}, 400,
     "context length is {C}"),
    ("over-long-text", "POST", "/generate", lambda f: {"text": "hello " * (f["context_length"] + 40)}, 400,
     "context length is {C}"),
    ("negative-temperature", "POST", "/generate", {"text": "hi", "sampling_params": {"temperature": -1}}, 400,
     "temperature"),
    ("top-p-zero", "POST", "/generate", {"text": "hi", "sampling_params": {"top_p": 0}}, 400, "top_p"),
    ("top-k-zero", "POST", "/generate", {"text": "hi", "sampling_params": {"top_k": 0}}, 400, "top_k"),
    ("negative-max-new", "POST", "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": -1}}, 400,
     "max_new_tokens"),
    ("float-max-new", "POST", "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 1.5}}, 400,
     "max_new_tokens"),
    ("empty-stop", "POST", "/generate", {"text": "hi", "sampling_params": {"stop": [""]}}, 400, "stop"),
    ("n-65", "POST", "/generate", {"text": "hi", "sampling_params": {"n": 65}}, 400, "n=65"),
    ("n-in-a-list", "POST", "/generate", {"text": ["a", "b"], "sampling_params": [{"n": 2}, {}]}, 400,
     "one sampling_params object"),
    ("n-stream", "POST", "/generate", {"text": "a", "stream": True, "sampling_params": {"n": 2}}, 400,
     "n = 1 only"),
    ("stop-id-outside-vocab", "POST", "/generate",
     lambda f: {"text": "hi", "sampling_params": {"stop_token_ids": [f["vocab_size"]]}}, 400,
     "stop_token_ids"),
    ("token-id-negative", "POST", "/generate", {"input_ids": [1, -1]}, 400, "outside the vocabulary"),
    ("token-id-too-large", "POST", "/generate", lambda f: {"input_ids": [1, f["vocab_size"]]}, 400,
     "outside the vocabulary [0, {V})"),
    ("token-id-huge", "POST", "/generate", {"input_ids": [10**20]}, 400, "input_ids"),
    ("batch-one-bad", "POST", "/generate",
     lambda f: {"input_ids": [[1, 2], [3, f["vocab_size"] + 7]], "sampling_params": GREEDY}, 400,
     "outside the vocabulary"),
    ("stream-batch", "POST", "/generate", {"text": ["a", "b"], "stream": True}, 400, "single prompt"),
    ("stream-bad-params", "POST", "/generate",
     {"text": "hi", "stream": True, "sampling_params": {"temperature": "hot"}}, 400, "temperature"),
    ("oversized-body", "POST", "/generate", b'{"text": "' + b"a" * (9 * 1024 * 1024) + b'"}', 413,
     "exceeds the limit"),
    ("wrong-method", "GET", "/generate", None, 405, "Method Not Allowed"),
    ("chat-bad-role", "POST", "/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, 400,
     "role"),
    ("chat-image-part", "POST", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400,
     "not supported"),
    ("completion-max-tokens-string", "POST", "/v1/completions", {"prompt": "x", "max_tokens": "5"}, 400,
     "max_tokens"),
    ("completion-empty-prompt", "POST", "/v1/completions", {"prompt": ""}, 400, "empty"),
    ("lone-surrogate", "POST", "/generate", b'{"text": "hi \\ud800 there"}', 400, "lone surrogate U+D800"),
    ("lone-surrogate-batch", "POST", "/generate", b'{"text": ["ok", "\\udfff"]}', 400, "lone surrogate"),
    ("invalid-utf8", "POST", "/generate", b'{"text": "hi \xff\xfe"}', 400, "malformed JSON"),
    ("abort-unknown-rid", "POST", "/abort_request", {"rid": "no-such-request"}, 404, "no live request"),
    ("abort-no-rid", "POST", "/abort_request", {}, 400, "rid"),
    ("abort-rid-wrong-type", "POST", "/abort_request", {"rid": 7}, 400, "rid"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_request_gets_clear_4xx_and_server_survives(client, facts, case):
    _, method, path, body, status, message = case
    body = body(facts) if callable(body) else body
    message = message.replace("{V}", str(facts["vocab_size"])).replace("{C}", str(facts["context_length"]))
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body} if body is not None else {}
    r = client.request(method, path, **kwargs, headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    error = r.json()
    assert error["object"] == "error" and error["code"] == status
    assert message in error["message"], error["message"]
    assert client.get("/health").status_code == 200
    assert_kv_baseline(client)


def test_huge_max_new_tokens_is_capped_to_the_context(client, facts):
    """A max_new_tokens beyond the context is capped to what the context and the KV pool allow: up to the
    context length, and at most pool + 1 tokens in all (the last sampled token needs no KV)."""
    prompt_len = min(facts["context_length"], facts["max_request_tokens"]) - 50
    expected = min(facts["context_length"] - prompt_len, facts["max_request_tokens"] - prompt_len + 1)
    r = client.post("/generate", json={"input_ids": [3] * prompt_len, "sampling_params": {
        "temperature": 0, "max_new_tokens": 10**12, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    meta = r.json()["meta_info"]
    assert meta["completion_tokens"] == expected and meta["finish_reason"]["type"] == "length"
    assert_kv_baseline(client)


def test_chunked_oversized_body_is_rejected(server):
    def chunks():
        for _ in range(10):
            yield b"a" * (1024 * 1024)

    r = httpx.post(server.url + "/generate", content=chunks(), headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and "exceeds the limit" in r.json()["message"]
