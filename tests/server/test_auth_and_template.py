"""A second server with --api-key, whose tokenizer (--tokenizer-path) has no chat template."""

from __future__ import annotations

import shutil

import httpx
import pytest

from tests.server.conftest import ENGINE_FLAGS, ServerProcess, flags_of

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

KEY = "sk-test-key"


@pytest.fixture(scope="module")
def keyed_server(model_dir, tmp_path_factory):
    tok_dir = tmp_path_factory.mktemp("no_template")
    shutil.copy(model_dir / "tokenizer.json", tok_dir / "tokenizer.json")
    (tok_dir / "tokenizer_config.json").write_text('{"eos_token": "<|end|>"}')
    proc = ServerProcess(["--model-path", str(model_dir), "--tokenizer-path", str(tok_dir), "--api-key", KEY,
                          *flags_of(ENGINE_FLAGS)])
    yield proc
    assert proc.stop() == 0


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}])
@pytest.mark.parametrize("method,path", [("POST", "/generate"), ("POST", "/v1/completions"),
                                         ("GET", "/v1/models"), ("GET", "/metrics"),
                                         ("GET", "/get_server_info"), ("POST", "/flush_cache")])
def test_requests_without_the_key_get_401(keyed_server, headers, method, path):
    r = httpx.request(method, keyed_server.url + path, headers=headers, json={"text": "hi"})
    assert r.status_code == 401 and r.json()["code"] == 401 and "API key" in r.json()["message"]


def test_health_is_open_and_the_key_works(keyed_server):
    assert httpx.get(keyed_server.url + "/health").status_code == 200
    auth = {"Authorization": f"Bearer {KEY}"}
    r = httpx.post(keyed_server.url + "/generate", headers=auth, timeout=60,
                   json={"text": "hi", "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
    assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] >= 1
    info = httpx.get(keyed_server.url + "/get_model_info", headers=auth).json()
    assert info["has_chat_template"] is False and info["tokenizer_path"] != info["model_path"]


def test_chat_without_template_is_a_clear_400(keyed_server):
    r = httpx.post(keyed_server.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                   json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 400 and "no chat template" in r.json()["message"]
