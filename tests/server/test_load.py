"""Concurrency and cleanup: 64 concurrent requests all answered correctly, /metrics scrapeable and
consistent, KV usage back to baseline after the load drains and after clients disconnect mid-request."""

from __future__ import annotations

import concurrent.futures
import time

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import assert_kv_baseline

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

NUM_REQUESTS = 64


def scrape(client: httpx.Client) -> dict[str, float]:
    """Samples of /metrics by name (labels dropped for histograms' _count/_sum; buckets skipped)."""
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {s.name: s.value for family in text_string_to_metric_families(r.text) for s in family.samples
            if not s.name.endswith("_bucket")}


def test_64_concurrent_requests_all_correct_then_metrics_and_kv_baseline(server, client, reference, facts):
    rng = np.random.RandomState(7)
    vocab = facts["vocab_size"]
    shared = rng.randint(1, vocab, size=32).tolist()  # half the prompts share a 32-token prefix
    prompts = [(shared if i % 2 else []) + rng.randint(1, vocab, size=rng.randint(3, 40)).tolist()
               for i in range(NUM_REQUESTS)]
    lengths = rng.randint(1, 12, size=NUM_REQUESTS).tolist()
    before = scrape(client)

    def send(i: int) -> dict:
        with httpx.Client(base_url=server.url, timeout=300) as c:
            r = c.post("/generate", json={"input_ids": prompts[i], "sampling_params": {
                "temperature": 0, "max_new_tokens": lengths[i]}})
        assert r.status_code == 200, r.text
        return r.json()

    with concurrent.futures.ThreadPoolExecutor(NUM_REQUESTS) as pool:
        outs = list(pool.map(send, range(NUM_REQUESTS)))
    # scraped first: gen_throughput is a recent-window rate, and the reference below may outlast the window
    after = scrape(client)
    for prompt, n, out in zip(prompts, lengths, outs, strict=True):
        assert out["output_ids"] == reference.generate(prompt, n)[1]
    assert_kv_baseline(client)

    completion = sum(o["meta_info"]["completion_tokens"] for o in outs)
    prompt_tokens = sum(len(p) for p in prompts)
    delta = {name: after[name] - before[name] for name in after if name in before}
    assert delta["sglang:num_requests_total"] == NUM_REQUESTS
    assert delta["sglang:generation_tokens_total"] == completion
    assert delta["sglang:prompt_tokens_total"] == prompt_tokens
    assert delta["sglang:e2e_request_latency_seconds_count"] == NUM_REQUESTS
    cached = sum(o["meta_info"]["cached_tokens"] for o in outs)
    assert cached >= 16  # later requests of the shared-prefix half reuse whole pages
    assert delta["sglang:cached_tokens_total"] == cached
    assert 0 < after["sglang:cache_hit_rate"] <= 1
    assert after["sglang:num_running_reqs"] == 0 and after["sglang:num_queue_reqs"] == 0
    assert after["sglang:token_usage"] == 0 and after["sglang:spec_accept_length"] == 1.0
    assert after["sglang:gen_throughput"] > 0


def wait_aborted(client: httpx.Client, target: float, timeout_s: float = 30) -> float:
    deadline = time.monotonic() + timeout_s
    while (value := scrape(client)["sglang:num_aborted_requests_total"]) < target:
        assert time.monotonic() < deadline, f"{value} aborted, expected {target}"
        time.sleep(0.1)
    return value


LONG = {"temperature": 0, "max_new_tokens": 240, "ignore_eos": True}


def test_disconnected_streams_are_aborted_and_free_their_kv(server, client):
    aborted = scrape(client)["sglang:num_aborted_requests_total"]
    for i in range(4):
        with httpx.Client(base_url=server.url, timeout=60) as c, \
                c.stream("POST", "/generate", json={"input_ids": [i + 1] * 12, "sampling_params": LONG,
                                                    "stream": True}) as r:
            lines = r.iter_lines()  # kept referenced: a discarded iterator would close the response
            first = next(line for line in lines if line.startswith("data: "))
            assert '"completion_tokens": 1' in first
            busy = client.post("/flush_cache")  # a request is running: refused, nothing changes
            assert busy.status_code == 409 and "running" in busy.json()["message"]
        # leaving the block closes the connection after one chunk of 240
    assert wait_aborted(client, aborted + 4) == aborted + 4
    assert_kv_baseline(client)


def test_disconnected_non_streaming_request_is_aborted(server, client):
    aborted = scrape(client)["sglang:num_aborted_requests_total"]
    # several long requests at once make each step slower, so none can finish before the client gives up
    bodies = [{"input_ids": [i + 20] * 12, "sampling_params": LONG} for i in range(6)]

    def send(body):
        try:
            httpx.post(server.url + "/generate", json=body, timeout=0.15)
        except httpx.TimeoutException:
            return True
        return False

    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        timed_out = sum(pool.map(send, bodies))
    assert timed_out == len(bodies)
    assert wait_aborted(client, aborted + timed_out) == aborted + timed_out
    assert_kv_baseline(client)
