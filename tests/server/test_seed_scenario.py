"""The seed's scenario (SGLang PR #11231 recipe): nine growing prompts build a chain of radix nodes, then a
test prompt that extends them is sent with send_one; its answer and acc_length must not depend on the
radix cache (`--disable-radix-cache`).

EAGLE-3 is not in the engine yet (issue #6), so both servers decode without a draft and acc_length is 1.0
by definition; what this checks today is that prefix reuse (cached_tokens > 0 with the cache, 0 without)
leaves the output unchanged. Once the engine takes `speculative_algorithm`, SPEC_FLAGS gets the EAGLE3
flags and the same assertions compare real acceptance lengths.
"""

from __future__ import annotations

import httpx
import pytest

from jaxserve.test.send_one import STOP
from tests.server.conftest import ENGINE_FLAGS, ServerProcess, flags_of
from tests.server.test_cli import run_send_one

SPEC_FLAGS: list[str] = []
WORDS = ["You", "are", "a", "helpful,", "respectful", "and", "honest", "assistant"]
# A long shared system text so that the growing prompts span whole pages (page size 16 in these tests).
SYSTEM = "Always answer as helpfully as possible, while being safe. " * 3
# "You xxx", "You are xxx", ... (the 9th repeats the 8th, all 8 words).
PREFIX_PROMPTS = [SYSTEM + " ".join(WORDS[:i]) + " xxx" for i in range(1, 10)]
TEST_PROMPT = SYSTEM + " ".join(WORDS) + ". Tell me about the FastAPI server."


@pytest.fixture(scope="module")
def no_radix_server(model_dir):
    proc = ServerProcess(["--model-path", str(model_dir), *flags_of(ENGINE_FLAGS), "--disable-radix-cache",
                          *SPEC_FLAGS])
    yield proc
    assert proc.stop() == 0


def play(server) -> tuple[list[dict], str]:
    """The nine prefix prompts (3 new tokens each) through /generate, then send_one on the test prompt."""
    metas = []
    with httpx.Client(base_url=server.url, timeout=120) as c:
        for prompt in PREFIX_PROMPTS:
            r = c.post("/generate", json={"text": prompt, "sampling_params": {"temperature": 0,
                                                                              "max_new_tokens": 3}})
            assert r.status_code == 200, r.text
            metas.append(r.json()["meta_info"])
        r = c.post("/generate", json={"text": TEST_PROMPT, "sampling_params": {
            "temperature": 0, "max_new_tokens": 16, "stop": STOP}})
        metas.append(r.json()["meta_info"])
    return metas, run_send_one(server, "--prompt", TEST_PROMPT, "--max-new-tokens", "16")


def table_row(stdout: str) -> list[str]:
    return [c.strip() for c in stdout.rstrip("\n").split("\n")[-2].strip("|").split("|")]


def test_seed_scenario_same_answer_and_acc_length_with_and_without_radix(server, no_radix_server, reference):
    assert len(PREFIX_PROMPTS) == 9
    metas_on, out_on = play(server)
    metas_off, out_off = play(no_radix_server)
    assert sum(m["cached_tokens"] for m in metas_on[1:]) > 0  # the chain is reused with the cache
    assert all(m["cached_tokens"] == 0 for m in metas_off)
    text, _ = reference.generate(TEST_PROMPT, 16, stop=STOP)
    assert out_on.rstrip("\n").split("\n")[:-5] == out_off.rstrip("\n").split("\n")[:-5] == text.split("\n")
    _, tokens_on, acc_on, _ = table_row(out_on)
    _, tokens_off, acc_off, _ = table_row(out_off)
    assert tokens_on == tokens_off and acc_on == acc_off
    if not SPEC_FLAGS:
        assert acc_on == "1.000"
