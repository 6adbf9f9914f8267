"""What an operator sees: SGLang-named Prometheus metrics with a model_name label (process collectors, token
gauges, time per output token), control-plane reads that never wait for the engine thread, /abort_request by
rid, the interval / request / compile-stall log lines, a banner without the API key, a per-start random seed,
and /v1/models reporting the length a request can really have. In-process (Starlette's TestClient)."""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from jaxserve.api import Engine
from jaxserve.server import create_app
from jaxserve.server.args import parse_launch_args
from jaxserve.server.launch import banner, with_random_seed
from jaxserve.server.warmup import plan_shapes
from tests.server.conftest import ENGINE_FLAGS

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

GREEDY = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine(model_dir):
    return Engine(model_path=str(model_dir), **ENGINE_FLAGS)


def _samples(text: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append(s)
    return out


def test_metrics_use_sglang_names_with_model_name_and_count_tokens(engine):
    with TestClient(create_app(engine, served_model_name="tiny-model")) as client:
        r = client.post("/generate", json={"input_ids": list(range(5, 45)), "sampling_params": GREEDY})
        assert r.status_code == 200, r.text
        samples = _samples(client.get("/metrics").text)
    labelled = {name: s for name, s in samples.items() if name.startswith("sglang:")}
    for name in ("sglang:prompt_tokens_total", "sglang:generation_tokens_total", "sglang:num_requests_total",
                 "sglang:token_usage", "sglang:num_used_tokens", "sglang:max_total_num_tokens",
                 "sglang:kv_evictable_tokens", "sglang:swa_token_usage", "sglang:cache_hit_rate",
                 "sglang:time_per_output_token_seconds_count", "sglang:time_to_first_token_seconds_count"):
        assert name in labelled, sorted(labelled)
        assert all(s.labels.get("model_name") == "tiny-model" for s in labelled[name]), labelled[name]
    value = {name: s[0].value for name, s in labelled.items()}
    assert value["sglang:generation_tokens_total"] == 6 and value["sglang:prompt_tokens_total"] == 40
    assert value["sglang:max_total_num_tokens"] == engine.kv.num_slots
    assert value["sglang:num_used_tokens"] == 0  # idle: the finished prompt is cached (evictable), not used
    assert value["sglang:kv_evictable_tokens"] >= 32  # two whole pages of 16 slots
    assert value["sglang:time_per_output_token_seconds_count"] == 1
    assert "python_info" in samples and "python_gc_objects_collected_total" in samples
    assert "process_resident_memory_bytes" in samples  # Linux: /proc is there
    assert not any(name.startswith("jaxserve:") for name in samples)


def test_metrics_prefix_jaxserve_is_an_option(engine):
    with TestClient(create_app(engine, metrics_prefix="jaxserve")) as client:
        samples = _samples(client.get("/metrics").text)
    assert "jaxserve:num_running_reqs" in samples and "sglang:num_running_reqs" not in samples


def test_control_plane_reads_answer_while_the_engine_thread_is_busy(engine, monkeypatch):
    """A step that takes long (a compile, here a step held on an event) does not hold up /get_server_info,
    /metrics, /v1/models or /health: they read what the engine published."""
    entered, release = threading.Event(), threading.Event()
    real_step = engine.step

    def slow_step():
        entered.set()
        release.wait(30)
        return real_step()

    monkeypatch.setattr(engine, "step", slow_step)
    with TestClient(create_app(engine)) as client:
        result = {}
        worker = threading.Thread(target=lambda: result.update(r=client.post(
            "/generate", json={"input_ids": [3, 4, 5], "sampling_params": GREEDY})))
        worker.start()
        assert entered.wait(30)
        try:
            for path in ("/get_server_info", "/metrics", "/v1/models", "/health"):
                t0 = time.perf_counter()
                r = client.get(path)
                assert r.status_code == 200 and time.perf_counter() - t0 < 2.0, path
            memory = client.get("/get_server_info").json()["memory"]
            assert memory["num_running"] + memory["num_waiting"] == 1 and "checked" not in memory
        finally:
            release.set()
            worker.join(60)
        assert result["r"].status_code == 200
        deadline = time.monotonic() + 10
        while not (memory := client.get("/get_server_info").json()["memory"]).get("checked"):
            assert time.monotonic() < deadline, memory
            time.sleep(0.05)
        assert memory["num_running"] == memory["num_waiting"] == 0 and memory["token_usage"] == 0


def test_abort_request_by_rid_ends_the_stream_and_frees_its_kv(engine):
    with TestClient(create_app(engine)) as client:
        body = {"input_ids": [9, 10, 11], "stream": True,
                "sampling_params": {"temperature": 0, "max_new_tokens": 400, "ignore_eos": True}}
        with client.stream("POST", "/generate", json=body) as stream:
            lines = stream.iter_lines()
            first = next(line for line in lines if line.startswith("data: {"))
            rid = json.loads(first[6:])["meta_info"]["id"]
            r = client.post("/abort_request", json={"rid": rid})
            assert r.status_code == 200 and r.json() == {"success": True, "rid": rid}
            chunks = [line for line in lines if line.startswith("data: {")]
        final = json.loads(chunks[-1][6:])
        assert final["meta_info"]["finish_reason"]["type"] == "abort"
        assert final["meta_info"]["completion_tokens"] < 400
        again = client.post("/abort_request", json={"rid": rid})
        assert again.status_code == 404 and rid in again.json()["message"]
        deadline = time.monotonic() + 10
        while not (memory := client.get("/get_server_info").json()["memory"]).get("checked"):
            assert time.monotonic() < deadline, memory
            time.sleep(0.05)
        assert memory["token_usage"] == 0 and memory["free_slots"] + memory["evictable_slots"] == \
            memory["num_slots"]


def test_v1_models_reports_the_length_a_request_can_have(engine):
    with TestClient(create_app(engine)) as client:
        model = client.get("/v1/models").json()["data"][0]
    assert model["max_model_len"] == min(engine.context_length, engine.kv.max_request_tokens)
    assert model["max_model_len"] <= engine.kv.num_slots


def test_interval_and_request_log_lines(engine, caplog):
    caplog.set_level(logging.INFO, logger="jaxserve.server")
    with TestClient(create_app(engine, log_interval=1, log_requests=True)) as client:
        r = client.post("/generate", json={"input_ids": [5, 6, 7], "sampling_params": GREEDY})
        assert r.status_code == 200
    rid = r.json()["meta_info"]["id"]
    messages = [rec.getMessage() for rec in caplog.records]
    interval = [m for m in messages if m.startswith("Decode batch. #running-req: ")]
    assert interval and all("token usage: " in m and "gen throughput (token/s): " in m and "accept len: " in m
                            for m in interval)
    finish = [m for m in messages if m.startswith(f"Finish: rid={rid},")]
    assert finish == [f"Finish: rid={rid}, prompt_tokens=3, completion_tokens=6, cached_tokens="
                      f"{r.json()['meta_info']['cached_tokens']}, finish=length, "
                      f"e2e_latency={r.json()['meta_info']['e2e_latency']:.3f} s"]


def test_no_request_lines_without_log_requests(engine, caplog):
    caplog.set_level(logging.INFO, logger="jaxserve.server")
    with TestClient(create_app(engine, log_interval=0)) as client:
        r = client.post("/generate", json={"input_ids": [5, 6], "sampling_params": GREEDY})
        assert r.status_code == 200
    assert not [rec for rec in caplog.records if rec.getMessage().startswith(("Finish:", "Decode batch."))]


def test_banner_never_prints_the_api_key():
    text = banner("127.0.0.1", 30000, "sk-very-secret-123")
    assert "sk-very-secret-123" not in text and "$JAXSERVE_API_KEY" in text
    assert "Authorization" not in banner("127.0.0.1", 30000, None)


def test_unseeded_requests_get_a_random_base_seed_per_start_unless_fixed():
    seeds = {with_random_seed(parse_launch_args([])).engine_kwargs["random_seed"] for _ in range(4)}
    assert len(seeds) == 4 and all(0 <= s < 2**63 for s in seeds)
    fixed = with_random_seed(parse_launch_args(["--random-seed", "5"]))
    assert fixed.engine_kwargs["random_seed"] == 5


def test_operations_flags_parse():
    args = parse_launch_args(["--enable-metrics", "--metrics-prefix", "jaxserve", "--log-requests",
                              "--decode-log-interval", "10", "--compilation-cache-dir", "/tmp/x"])
    assert (args.metrics_prefix, args.log_requests, args.decode_log_interval) == ("jaxserve", True, 10)
    assert args.compilation_cache_dir == "/tmp/x" and not args.disable_compilation_cache
    assert parse_launch_args(["--disable-compilation-cache"]).disable_compilation_cache
    with pytest.raises(SystemExit):
        parse_launch_args(["--decode-log-interval", "-1"])
    with pytest.raises(SystemExit):
        parse_launch_args(["--metrics-prefix", "vllm"])


def test_warmup_runs_while_serving_and_health_reports_its_progress(engine, reference):
    total = len(plan_shapes(engine))
    with TestClient(create_app(engine, warmup=True)) as client:
        health = client.get("/health")
        assert health.status_code == 200
        assert health.json()["status"] == "warming" and health.json()["total"] == total
        assert 0 <= health.json()["compiled"] < total
        prompt = [11, 12, 13, 14]
        r = client.post("/generate", json={"input_ids": prompt, "sampling_params": GREEDY})
        assert r.status_code == 200
        assert r.json()["output_ids"] == reference.generate(prompt, 6, ignore_eos=True)[1]
        seen = []
        deadline = time.monotonic() + 600
        while (health := client.get("/health")).content:
            seen.append(health.json()["compiled"])
            assert time.monotonic() < deadline, seen
            time.sleep(0.2)
        assert health.status_code == 200 and seen == sorted(seen)


def test_gen_throughput_counts_the_tokens_of_the_last_window_only():
    from types import SimpleNamespace

    from jaxserve.server.metrics import KVUsage, ServerMetrics

    metrics = ServerMetrics(window_s=0.5)
    req = SimpleNamespace(rid="r", arrival_time=time.perf_counter())
    metrics.on_submit(req)
    usage = KVUsage(num_slots=64, free_slots=60, evictable_slots=2)
    metrics.on_tokens(req, 3, first=True)
    metrics.on_tokens(req, 2, first=False)
    metrics.on_step(usage, 1, 0)
    assert metrics.snapshot()["throughput"] == 5 / 0.5
    assert metrics.snapshot()["token_usage"] == 2 / 64
    time.sleep(0.6)
    metrics.on_tokens(req, 4, first=False)
    metrics.on_step(usage, 1, 0)
    assert metrics.snapshot()["throughput"] == 4 / 0.5
