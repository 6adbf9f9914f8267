"""If the engine itself fails (a bug: `Engine.step` raises), the server does not hang or die: pending
requests get a 500 naming the failure, /health turns 503 (so a supervisor restarts the process) and new
requests get 503. Failure injected in-process (the app served by Starlette's TestClient)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from jaxserve.engine import Engine
from jaxserve.server import create_app
from tests.server.conftest import ENGINE_FLAGS


def test_engine_failure_turns_health_503_and_fails_requests_clearly(model_dir):
    engine = Engine(model_path=str(model_dir), **ENGINE_FLAGS)

    def broken_step():
        raise RuntimeError("injected engine failure")

    engine.step = broken_step
    with TestClient(create_app(engine), raise_server_exceptions=False) as client:
        assert client.get("/health").status_code == 200
        r = client.post("/generate", json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}})
        assert r.status_code == 500 and "injected engine failure" in r.json()["message"]
        health = client.get("/health")
        assert health.status_code == 503 and "injected engine failure" in health.json()["error"]
        again = client.post("/generate", json={"input_ids": [1, 2, 3]})
        assert again.status_code == 503 and "restart the server" in again.json()["message"]
