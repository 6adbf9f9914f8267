"""A server over a tiny gpt-oss (sliding-window layers + sinks + MoE: hybrid KV pools and the SWA radix
tree, as the embedded default): greedy answers equal the in-process Engine's, prefixes are reused, and
the KV accounting returns to baseline after concurrent load and a disconnected stream."""

from __future__ import annotations

import concurrent.futures

import httpx
import numpy as np
import pytest

from tests.server.checkpoint import write_tiny_checkpoint
from tests.server.conftest import ENGINE_FLAGS, ServerProcess, assert_kv_baseline, flags_of

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

FLAGS = {**ENGINE_FLAGS, "swa_full_tokens_ratio": 0.5}


@pytest.fixture(scope="module")
def gpt_oss_dir(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny_gpt_oss"), model_type="gpt_oss")


@pytest.fixture(scope="module")
def hybrid(gpt_oss_dir):
    proc = ServerProcess(["--model-path", str(gpt_oss_dir), *flags_of(FLAGS)])
    with httpx.Client(base_url=proc.url, timeout=120) as client:
        yield proc, client
    assert proc.stop() == 0


def test_hybrid_server_matches_engine_and_frees_kv(hybrid, gpt_oss_dir):
    from jaxserve.api import Engine

    proc, client = hybrid
    engine = Engine(model_path=str(gpt_oss_dir), **FLAGS)
    assert engine.kv.hybrid  # the SWA path is what this module is about
    rng = np.random.RandomState(3)
    shared = rng.randint(1, 512, size=40).tolist()
    prompts = [shared + rng.randint(1, 512, size=n).tolist() for n in (3, 9, 17, 30, 5, 12, 21, 8)]

    def send(prompt):
        r = httpx.post(proc.url + "/generate", timeout=120, json={
            "input_ids": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 12}})
        assert r.status_code == 200, r.text
        return r.json()

    first = send(prompts[0])  # caches the shared prefix
    with concurrent.futures.ThreadPoolExecutor(len(prompts) - 1) as pool:
        outs = [first, *pool.map(send, prompts[1:])]
    for prompt, out in zip(prompts, outs, strict=True):
        ref = engine.generate(input_ids=prompt, sampling_params={"temperature": 0, "max_new_tokens": 12})
        assert out["output_ids"] == ref["output_ids"]
    assert sum(o["meta_info"]["cached_tokens"] for o in outs[1:]) >= 7 * 32  # two whole pages of the prefix
    assert_kv_baseline(client)

    with client.stream("POST", "/generate", json={"input_ids": shared, "stream": True, "sampling_params": {
            "max_new_tokens": 200, "ignore_eos": True}}) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: "))
    assert_kv_baseline(client)
    mem = client.get("/get_server_info").json()["memory"]
    assert mem["free_slots"] + mem["evictable_slots"] == mem["num_slots"]
