"""Multi-host serving (`jaxserve.engine.multihost`): two local CPU processes joined by `jax.distributed`
(coordinator on 127.0.0.1), two fake CPU devices each, tp 4 over the four. Rank 0 runs the HTTP server and
the scheduler, rank 1 follows its steps; one greedy /generate request must give the output of the same
model in one process. SIGTERM to rank 0 stops both (rank 0 broadcasts the stop). Every child is killed
when the test fails or runs out of time.

The leader/follower operation stream itself (send, receive, follow) is checked without processes in
`test_broadcast_protocol_*`, with the collective replaced by a local queue."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from jaxserve.assets import EMBEDDED_MODEL_DIR, embedded_model_available
from jaxserve.engine import multihost

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "Once upon a time,"
NEW_TOKENS = 12
PENALISED = {"temperature": 0, "max_new_tokens": 6, "frequency_penalty": 1.5}
ENGINE_FLAGS = ["--max-total-tokens", "1024", "--chunked-prefill-size", "64", "--max-running-requests", "4"]
DEADLINE_S = 400  # the whole two-process run, start to exit


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(devices: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _start(args: list[str], log: Path, devices: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=_env(devices), stdout=log.open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def _single_process_reference() -> tuple[list[int], dict]:
    """(greedy ids of PROMPT, the penalised request's output ids and prompt logprobs) in one process."""
    code = ("import json; from jaxserve.api import Engine; from jaxserve.assets import EMBEDDED_MODEL_DIR\n"
            "e = Engine(str(EMBEDDED_MODEL_DIR), max_total_tokens=1024, chunked_prefill_size=64, "
            "max_running_requests=4)\n"
            f"out = e.generate({PROMPT!r}, {{'temperature': 0, 'max_new_tokens': {NEW_TOKENS}}})\n"
            f"pen = e.generate({PROMPT!r}, {{**{PENALISED!r}, 'prompt_logprobs': True}})\n"
            "print('IDS', json.dumps(out['output_ids']))\n"
            "print('PEN', json.dumps({'ids': pen['output_ids'], "
            "'prompt': [x[0] for x in pen['meta_info']['input_token_logprobs']]}))\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(1), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = {x[:3]: json.loads(x[4:]) for x in result.stdout.splitlines() if x[:4] in ("IDS ", "PEN ")}
    return lines["IDS"], lines["PEN"]


def _post(port: int, payload: dict) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/generate", data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def _wait_for_banner(log: Path, procs: list[subprocess.Popen], deadline: float) -> int:
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            if line.startswith("jaxserve ready on http://"):
                return int(line.rsplit(":", 1)[1])
        for p in procs:
            if p.poll() is not None:
                pytest.fail(f"a process exited with {p.returncode} before the server was ready")
        time.sleep(0.5)
    pytest.fail("the two-process server was not ready in time")


@pytest.mark.slow
@pytest.mark.skipif(not embedded_model_available(), reason="the embedded default model is not built")
def test_two_cpu_processes_serve_one_request_like_one_process(tmp_path):
    coordinator = f"127.0.0.1:{_free_port()}"
    common = ["-m", "jaxserve.launch_server", "--model-path", str(EMBEDDED_MODEL_DIR), "--tp-size", "4",
              "--nnodes", "2", "--dist-init-addr", coordinator, "--disable-compilation-cache", *ENGINE_FLAGS]
    logs = [tmp_path / "rank0.log", tmp_path / "rank1.log"]
    procs: list[subprocess.Popen] = []
    deadline = time.monotonic() + DEADLINE_S
    try:
        procs.append(_start([*common, "--node-rank", "0", "--port", "0"], logs[0], 2))
        procs.append(_start([*common, "--node-rank", "1"], logs[1], 2))
        expected, penalised = _single_process_reference()  # runs while the two processes start
        port = _wait_for_banner(logs[0], procs, deadline)
        out = _post(port, {"text": PROMPT, "sampling_params": {"temperature": 0,
                                                               "max_new_tokens": NEW_TOKENS}})
        assert out["output_ids"] == expected
        assert out["meta_info"]["completion_tokens"] == NEW_TOKENS
        # a penalty row (a runner operation of its own) and the prompt-logprobs step program
        pen = _post(port, {"text": PROMPT, "sampling_params": PENALISED, "return_logprob": True,
                           "logprob_start_len": 0})
        assert pen["output_ids"] == penalised["ids"]
        prompt = [x[0] for x in pen["meta_info"]["input_token_logprobs"]]
        assert prompt[0] is None and penalised["prompt"][0] is None
        np.testing.assert_allclose(prompt[1:], penalised["prompt"][1:], rtol=1e-4, atol=1e-4)
        procs[0].send_signal(signal.SIGTERM)  # the leader shuts down and stops the follower
        for p in procs:
            p.wait(max(1.0, min(120.0, deadline - time.monotonic())))
        assert [p.returncode for p in procs] == [0, 0], [log.read_text()[-3000:] for log in logs]
        follower = logs[1].read_text()
        assert "multi-host follower 1/2: stopped by rank 0" in follower
        assert "jaxserve ready" not in follower  # only rank 0 serves HTTP
    except BaseException:
        for log in logs:
            if log.exists():
                print(f"--- {log.name}\n{log.read_text()[-4000:]}")
        raise
    finally:
        for p in procs:
            _kill(p)


# ------------------------------------------------------------------ the operation stream, in one process
class _FakeCollective:
    """`multihost._broadcast` over a local list: the source appends, the receiver pops in order and checks
    it asked for the same shape and dtype (as the real collective requires)."""

    def __init__(self) -> None:
        self.sent: list[np.ndarray] = []

    def __call__(self, value: np.ndarray, is_source: bool) -> np.ndarray:
        if is_source:
            self.sent.append(np.array(value))
            return value
        got = self.sent.pop(0)
        assert (got.shape, got.dtype) == (value.shape, value.dtype)
        return got


class _RecordingRunner:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def run(self, inp):
        self.calls.append(("run", inp))

    def run_with_prompt_logprobs(self, inp, next_ids):
        self.calls.append(("prompt", inp, next_ids))

    def set_penalty_row(self, row, prompt_ids, output_ids):
        self.calls.append(("penalty", row, prompt_ids, output_ids))


def test_broadcast_protocol_replays_the_leaders_operations_then_stops(monkeypatch):
    fake = _FakeCollective()
    monkeypatch.setattr(multihost, "_broadcast", fake)
    leader = multihost.Broadcaster()
    big = np.arange(5000, dtype=np.int32)  # a payload past the smallest size: padded to 32 KiB
    leader.send(multihost.OP_PENALTY_ROW, (3, np.array([1, 2]), [7]))
    leader.send(multihost.OP_STEP, ({"ids": big},))
    leader.send(multihost.OP_PROMPT_STEP, ("inp", np.array([4])))
    leader.stop()
    leader.stop()  # once only
    assert [x.size for x in fake.sent[1::2][:3]] == [1024, 32768, 1024]
    runner = _RecordingRunner()
    assert multihost.follow(runner) == 3
    assert not fake.sent
    kinds = [c[0] for c in runner.calls]
    assert kinds == ["penalty", "run", "prompt"]
    assert runner.calls[0][1] == 3 and runner.calls[0][3] == [7]
    np.testing.assert_array_equal(runner.calls[1][1]["ids"], big)
    with pytest.raises(RuntimeError, match="stopped"):
        leader.send(multihost.OP_STEP, (None,))
