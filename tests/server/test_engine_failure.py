"""Engine faults in-process (the app served by Starlette's TestClient). A step that raises fails only the
requests it ran: their clients get a 500 naming the failure, the KV they held is back, and the server goes on
serving (later requests give the greedy output a fresh engine gives). A step that keeps failing means the
engine is broken: /health turns 503 (so a supervisor restarts the process) and new requests get 503."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from jaxserve.api import Engine
from jaxserve.server import create_app
from jaxserve.server.engine_loop import MAX_STEP_FAILURES
from tests.server.conftest import ENGINE_FLAGS

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}


def test_a_failing_step_fails_only_its_requests_and_the_server_keeps_serving(model_dir, reference):
    engine = Engine(model_path=str(model_dir), **ENGINE_FLAGS)
    real_step, calls = engine.step, {"n": 0}

    def step_failing_once():
        calls["n"] += 1
        if calls["n"] == 3:  # mid-request: after its prefill, during its decode
            raise RuntimeError("injected step failure")
        return real_step()

    engine.step = step_failing_once
    with TestClient(create_app(engine), raise_server_exceptions=False) as client:
        r = client.post("/generate", json={"input_ids": [1, 2, 3], "sampling_params": GREEDY})
        assert r.status_code == 500 and "injected step failure" in r.json()["message"]
        assert client.get("/health").status_code == 200
        prompt = [4, 5, 6, 7]
        ok = client.post("/generate", json={"input_ids": prompt, "sampling_params": GREEDY})
        assert ok.status_code == 200, ok.text
        assert ok.json()["output_ids"] == reference.generate(prompt, 8, ignore_eos=True)[1]
        deadline = time.monotonic() + 10
        while not (memory := client.get("/get_server_info").json()["memory"]).get("checked"):
            assert time.monotonic() < deadline, memory
            time.sleep(0.05)
        assert memory["token_usage"] == 0, memory
        assert memory.get("live_only_pages", memory.get("live_only")) == 0, memory


def test_a_step_that_keeps_failing_turns_health_503_and_fails_requests_clearly(model_dir):
    engine = Engine(model_path=str(model_dir), **ENGINE_FLAGS)

    def broken_step():
        raise RuntimeError("injected engine failure")

    engine.step = broken_step
    with TestClient(create_app(engine), raise_server_exceptions=False) as client:
        assert client.get("/health").status_code == 200
        for _ in range(MAX_STEP_FAILURES):
            r = client.post("/generate", json={"input_ids": [1, 2, 3], "sampling_params": GREEDY})
            assert r.status_code == 500 and "injected engine failure" in r.json()["message"]
        health = client.get("/health")
        assert health.status_code == 503 and "injected engine failure" in health.json()["error"]
        again = client.post("/generate", json={"input_ids": [1, 2, 3]})
        assert again.status_code == 503 and "restart the server" in again.json()["message"]
