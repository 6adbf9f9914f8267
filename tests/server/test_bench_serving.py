"""bench_serving against the running server: every request completes with its exact output length, the
JSON summary is consistent with the per-request records, the shared-prefix set hits the prefix cache, and
the PNG plot is written."""

from __future__ import annotations

import json

import pytest

from jaxserve import bench_serving
from jaxserve.bench.serving_data import random_requests, shared_prefix_requests

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it


def test_datasets_are_deterministic_and_shaped_as_asked():
    a = random_requests(20, input_len=30, output_len=8, range_ratio=0.5, vocab_size=100, seed=3)
    assert a == random_requests(20, input_len=30, output_len=8, range_ratio=0.5, vocab_size=100, seed=3)
    assert all(15 <= r.prompt_len == len(r.prompt) <= 30 and 4 <= r.output_len <= 8 for r in a)
    g = shared_prefix_requests(num_groups=3, prompts_per_group=4, system_prompt_len=16, question_len=5,
                               output_len=7, vocab_size=100, seed=0)
    assert len(g) == 12 and all(r.prompt_len == 21 and r.output_len == 7 for r in g)
    assert len({tuple(r.prompt[:16]) for r in g}) == 3 and len({tuple(r.prompt) for r in g}) == 12
    text = random_requests(2, input_len=5, output_len=2, range_ratio=1.0, vocab_size=100, as_text=True)
    assert all(isinstance(r.prompt, str) and len(r.prompt.split()) == 5 for r in text)


@pytest.mark.parametrize("dataset", ["random", "generated-shared-prefix"])
def test_bench_serving_end_to_end(server, client, facts, tmp_path, dataset, capsys):
    client.post("/flush_cache")
    port = server.url.rsplit(":", 1)[1]
    out = tmp_path / "bench.json"
    argv = ["--host", "127.0.0.1", "--port", port, "--dataset-name", dataset, "--output-file", str(out),
            "--request-rate", "40", "--max-concurrency", "6", "--seed", "5"]
    if dataset == "random":
        argv += ["--num-prompts", "12", "--random-input-len", "24", "--random-output-len", "6",
                 "--random-range-ratio", "0.5"]
    else:
        # one at a time: each request finds the previous ones of its group cached
        argv += ["--gsp-num-groups", "2", "--gsp-prompts-per-group", "4", "--gsp-system-prompt-len", "48",
                 "--gsp-question-len", "8", "--gsp-output-len", "5", "--max-concurrency", "1"]
    assert bench_serving.main(argv) == 0
    assert "Serving Benchmark Result" in capsys.readouterr().out
    record = json.loads(out.read_text())
    summary, requests = record["summary"], record["requests"]
    expected = bench_serving.make_requests(bench_serving.build_parser().parse_args(argv), facts["vocab_size"])
    assert summary["completed"] == len(expected) and summary["failed"] == 0
    assert [r["output_len"] for r in requests] == [r.output_len for r in expected]  # ignore_eos: exact
    assert [r["prompt_len"] for r in requests] == [r.prompt_len for r in expected]
    assert summary["total_output_tokens"] == sum(r.output_len for r in expected)
    assert 0 < summary["p50_ttft_ms"] <= summary["p99_ttft_ms"] and summary["mean_itl_ms"] > 0
    assert summary["p50_e2e_latency_ms"] >= summary["p50_ttft_ms"] and summary["output_throughput"] > 0
    if dataset == "generated-shared-prefix":  # 6 of 8 requests reuse a 48-token system prompt (3 pages)
        assert summary["cached_tokens"] >= 6 * 48
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
