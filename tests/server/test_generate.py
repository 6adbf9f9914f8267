"""/generate over HTTP equals the in-process Engine's greedy output; streaming, batches, info routes."""

from __future__ import annotations

import itertools
import json

import pytest

from tests.server.conftest import assert_kv_baseline, memory

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

PROMPT = "Human: Give me a fully functional FastAPI server. Show the python code.\n\nAssistant:"
META_KEYS = {"id", "prompt_tokens", "completion_tokens", "cached_tokens", "spec_verify_ct", "finish_reason",
             "e2e_latency"}


def sse_payloads(response) -> list:
    """JSON payloads of an SSE response; asserts the stream ends with `data: [DONE]`."""
    events = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_generate_text_matches_engine_greedy(client, reference):
    r = client.post("/generate", json={"text": PROMPT, "sampling_params": {"temperature": 0,
                                                                          "max_new_tokens": 12}})
    assert r.status_code == 200, r.text
    out = r.json()
    text, ids = reference.generate(PROMPT, 12)
    assert out["output_ids"] == ids and out["text"] == text
    meta = out["meta_info"]
    assert set(meta) >= META_KEYS
    assert meta["prompt_tokens"] == len(reference.tokenizer.encode(PROMPT))
    assert meta["completion_tokens"] == len(ids) and meta["spec_verify_ct"] == 0
    assert meta["e2e_latency"] > 0 and meta["finish_reason"]["type"] in ("length", "stop")


def test_generate_input_ids_and_batch(client, reference):
    prompts = [[5, 6, 7, 8, 9], list(range(40, 80)), [200] * 3]
    r = client.post("/generate", json={"input_ids": prompts, "sampling_params": [
        {"temperature": 0, "max_new_tokens": n} for n in (3, 5, 7)]})
    assert r.status_code == 200, r.text
    outs = r.json()
    assert isinstance(outs, list) and len(outs) == 3
    for prompt, n, out in zip(prompts, (3, 5, 7), outs, strict=True):
        assert out["output_ids"] == reference.generate(prompt, n)[1]
        assert out["meta_info"]["prompt_tokens"] == len(prompt)


def test_generate_stream_is_cumulative_and_ends_like_non_stream(client, reference):
    body = {"text": "Question: what is the capital", "sampling_params": {"temperature": 0,
                                                                        "max_new_tokens": 10}}
    with client.stream("POST", "/generate", json={**body, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        chunks = sse_payloads(r)
    assert len(chunks) >= 2
    for before, after in itertools.pairwise(chunks):
        assert after["text"].startswith(before["text"])
        assert after["output_ids"][:len(before["output_ids"])] == before["output_ids"]
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    text, ids = reference.generate(body["text"], 10)
    assert chunks[-1]["output_ids"] == ids and chunks[-1]["text"] == text
    assert chunks[-1]["meta_info"]["finish_reason"] is not None


def test_repeated_prompt_reuses_prefix_then_flush_cache_frees_it(client):
    prompt = list(range(100, 164))  # 64 tokens = 4 pages of 16
    body = {"input_ids": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 2}}
    first = client.post("/generate", json=body).json()
    second = client.post("/generate", json=body).json()
    assert second["output_ids"] == first["output_ids"]
    assert second["meta_info"]["cached_tokens"] >= 48  # whole pages of the 64-token prompt
    assert memory(client)["evictable_slots"] > 0
    r = client.post("/flush_cache")
    assert r.status_code == 200 and r.json()["success"] is True
    mem = assert_kv_baseline(client)
    assert mem["free_slots"] == mem["num_slots"] and mem["evictable_slots"] == 0
    third = client.post("/generate", json=body).json()
    assert third["meta_info"]["cached_tokens"] == 0 and third["output_ids"] == first["output_ids"]


def test_info_routes(client, server, model_dir):
    assert client.get("/health").status_code == 200
    info = client.get("/get_model_info").json()
    assert info["model_path"] == str(model_dir) and info["is_generation"] is True
    server_info = client.get("/get_server_info").json()
    assert server_info["page_size"] == 16 and server_info["max_total_tokens"] == 4096
    assert server_info["port"] == int(server.url.rsplit(":", 1)[1])
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == str(model_dir)
    assert client.get("/no_such_route").status_code == 404


def test_banner_says_how_to_query(server):
    text = "".join(server.banner)
    assert f"curl {server.url}/generate" in text
    assert "python -m jaxserve.test.send_one" in text and f"--port {server.url.rsplit(':', 1)[1]}" in text
