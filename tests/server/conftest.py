"""Server test fixtures: a tiny checkpoint, real server processes on 127.0.0.1 (ephemeral ports), and an
in-process `Engine` with the same settings whose greedy outputs are the reference for HTTP answers.

By default the shipped embedded default (`jaxserve/assets/embedded`) is served; JAXSERVE_TEST_EMBEDDED=0
serves the tiny random checkpoint instead.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.server.checkpoint import use_embedded, write_tiny_checkpoint

ROOT = Path(__file__).resolve().parents[2]
# Small shapes: few compilations (the persistent cache in .jax_cache is shared with the server processes).
ENGINE_FLAGS = {"page_size": 16, "max_total_tokens": 4096, "chunked_prefill_size": 64,
                "max_running_requests": 16}
START_TIMEOUT_S = 180


def flags_of(kwargs: dict) -> list[str]:
    return [x for k, v in kwargs.items() for x in (f"--{k.replace('_', '-')}", str(v))]


class ServerProcess:
    """`python -m jaxserve.launch_server ARGS --port 0` as a child process; `url` once it printed ready."""

    def __init__(self, args: list[str]) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen([sys.executable, "-m", "jaxserve.launch_server", *args, "--host",
                                      "127.0.0.1", "--port", "0"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.stderr: list[str] = []
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        self.url = self._wait_ready()

    def _drain_stderr(self) -> None:
        for line in self.proc.stderr:
            self.stderr.append(line)

    def _wait_ready(self) -> str:
        deadline = time.monotonic() + START_TIMEOUT_S
        lines: list[str] = []
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("jaxserve ready on "):
                self.banner = lines + [self.proc.stdout.readline() for _ in range(3)]
                return line.split()[-1]
        self.stop()
        raise RuntimeError(f"server did not start: {''.join(lines)}\n{''.join(self.stderr[-30:])}")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30) -> int:
        """Signal the process and wait; returns its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    if use_embedded():
        from jaxserve.assets import EMBEDDED_MODEL_DIR

        return EMBEDDED_MODEL_DIR
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="session")
def server(model_dir):
    """The shared server (radix cache on); stopped with SIGTERM at the end, which must exit cleanly."""
    proc = ServerProcess(["--model-path", str(model_dir), *flags_of(ENGINE_FLAGS)])
    yield proc
    assert proc.stop() == 0, "".join(proc.stderr[-30:])


@pytest.fixture(scope="session")
def client(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="session")
def facts(client) -> dict:
    """The served model's vocab_size, context_length and max_request_tokens (the most KV one request can
    hold: the whole pool); tests derive lengths and ids from them."""
    info = client.get("/get_server_info").json()
    return {key: info[key] for key in ("vocab_size", "context_length", "max_request_tokens")}


@pytest.fixture(scope="session")
def reference(model_dir):
    """In-process Engine with the server's settings: `reference.generate(prompt_or_ids, n)` -> greedy
    (text, output_ids)."""
    from jaxserve.api import Engine

    engine = Engine(model_path=str(model_dir), **ENGINE_FLAGS)

    class Reference:
        tokenizer = engine.tokenizer  # HFTokenizer: encode, bos_token, eos_token

        @staticmethod
        def generate(prompt, max_new_tokens: int, **params) -> tuple[str, list[int]]:
            kwargs = {"input_ids": prompt} if isinstance(prompt, list) else {"prompt": prompt}
            params = {"temperature": 0, "max_new_tokens": max_new_tokens, **params}
            out = engine.generate(**kwargs, sampling_params=params)
            return out["text"], out["output_ids"]

    return Reference()


def memory(client: httpx.Client) -> dict:
    return client.get("/get_server_info").json()["memory"]


def assert_kv_baseline(client: httpx.Client, timeout_s: float = 30) -> dict:
    """Wait until the server is idle; then no slot is held by a live request or a locked prefix (the
    ownership proof `check_memory` passed on the server), and usage is 0. Returns the memory record."""
    deadline = time.monotonic() + timeout_s
    while True:
        mem = memory(client)
        if mem["num_running"] == mem["num_waiting"] == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert mem["num_running"] == mem["num_waiting"] == 0, mem
    assert mem.get("live_only_pages", mem.get("live_only")) == 0, mem
    assert mem["token_usage"] == 0, mem
    assert mem["free_slots"] + mem["evictable_slots"] == mem["num_slots"], mem
    return mem
