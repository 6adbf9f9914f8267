"""The seed's scenario (SGLang PR #11231 recipe) with EAGLE-3: nine growing prompts build a chain of radix
nodes, then send_one sends a test prompt that extends them. Its answer and its acc_length must be the same
with and without `--disable-radix-cache` (a prefix hit must not change what the draft sees), and the
answer must equal plain (non-speculative) greedy decoding: speculative decoding is lossless.

Target and draft: `checkpoint.write_spec_pair` (a tiny Llama and a head that guesses "the same token
again", so rounds accept 0..3 drafts).
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from jaxserve.test.send_one import STOP
from tests.server.checkpoint import write_spec_pair
from tests.server.conftest import ENGINE_FLAGS, ServerProcess, flags_of
from tests.server.test_cli import run_send_one
from tests.server.test_load import scrape

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

WORDS = ["You", "are", "a", "helpful,", "respectful", "and", "honest", "assistant"]
# A long shared system text so that the growing prompts span whole pages (page size 16 in these tests).
SYSTEM = "Always answer as helpfully as possible, while being safe. " * 3
# "You xxx", "You are xxx", ... (the 9th repeats the 8th, all 8 words).
PREFIX_PROMPTS = [SYSTEM + " ".join(WORDS[:i]) + " xxx" for i in range(1, 10)]
TEST_PROMPT = SYSTEM + " ".join(WORDS) + ". Human: Give me a fully functional FastAPI server."
MAX_NEW = 32
# One prefill chunk per prompt here, as in the PR's recipe. (A failure of the old speculative worker on
# prompts of k * chunked_prefill_size + 1 tokens, which this once worked around, is fixed: EAGLE-3 greedy
# outputs equal plain decoding at 64, 65, 128, 129 and 130 tokens with chunks of 64.)
SPEC_FLAGS = {**ENGINE_FLAGS, "chunked_prefill_size": 256}


@pytest.fixture(scope="module")
def spec_pair(tmp_path_factory):
    return write_spec_pair(tmp_path_factory.mktemp("spec_pair"))


def spec_server(spec_pair, *extra: str) -> ServerProcess:
    target, draft = spec_pair
    return ServerProcess(["--model-path", str(target), *flags_of(SPEC_FLAGS),
                          "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(draft),
                          "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                          "--speculative-num-draft-tokens", "4", "--speculative-policy", "always", *extra])


@pytest.fixture(scope="module")
def radix_on(spec_pair):
    proc = spec_server(spec_pair)
    yield proc
    assert proc.stop() == 0


@pytest.fixture(scope="module")
def radix_off(spec_pair):
    proc = spec_server(spec_pair, "--disable-radix-cache")
    yield proc
    assert proc.stop() == 0


@pytest.fixture(scope="module")
def plain_greedy(spec_pair):
    from jaxserve.api import Engine

    engine = Engine(model_path=str(spec_pair[0]), **SPEC_FLAGS)
    return lambda prompt, **p: engine.generate(prompt, {"temperature": 0, "max_new_tokens": MAX_NEW, **p})


def play(server) -> tuple[list[dict], str]:
    """The nine prefix prompts (3 new tokens each), the test prompt through /generate, then send_one."""
    metas = []
    with httpx.Client(base_url=server.url, timeout=120) as c:
        for prompt in [*PREFIX_PROMPTS, TEST_PROMPT]:
            r = c.post("/generate", json={"text": prompt, "sampling_params": {
                "temperature": 0, "max_new_tokens": MAX_NEW if prompt is TEST_PROMPT else 3, "stop": STOP}})
            assert r.status_code == 200, r.text
            metas.append(r.json()["meta_info"])
    return metas, run_send_one(server, "--prompt", TEST_PROMPT, "--max-new-tokens", str(MAX_NEW))


def table_row(stdout: str) -> list[str]:
    return [c.strip() for c in stdout.rstrip("\n").split("\n")[-2].strip("|").split("|")]


def test_seed_scenario_same_answer_and_acc_length_with_and_without_radix(radix_on, radix_off, plain_greedy):
    metas_on, out_on = play(radix_on)
    metas_off, out_off = play(radix_off)
    assert sum(m["cached_tokens"] for m in metas_on[1:]) > 0  # the chain is reused with the cache
    assert all(m["cached_tokens"] == 0 for m in metas_off)
    test_on, test_off = metas_on[-1], metas_off[-1]
    assert test_on["spec_verify_ct"] > 0 and max(test_on["spec_accept_lengths"]) > 0  # drafts accepted
    assert test_on["spec_accept_lengths"] == test_off["spec_accept_lengths"]
    expected = plain_greedy(TEST_PROMPT, stop=STOP)["text"]
    # send_one prints the text, acc_length= and speed= lines, then a 5-line table
    text_lines = [out.rstrip("\n").split("\n")[:-7] for out in (out_on, out_off)]
    assert text_lines[0] == text_lines[1] == expected.split("\n")
    acc_lines = [out.rstrip("\n").split("\n")[-7] for out in (out_on, out_off)]
    acc = test_on["completion_tokens"] / test_on["spec_verify_ct"]
    assert acc_lines[0] == acc_lines[1] == f"acc_length={acc:.2f}"
    _, tokens_on, acc_on, _ = table_row(out_on)
    _, tokens_off, acc_off, _ = table_row(out_off)
    assert tokens_on == tokens_off and acc_on == acc_off
    assert acc_on == f"{test_on['completion_tokens'] / test_on['spec_verify_ct']:.3f}" != "1.000"


def test_speculative_generate_is_lossless_and_metrics_report_acceptance(radix_on, plain_greedy):
    with httpx.Client(base_url=radix_on.url, timeout=120) as c:
        for prompt in ("Hello world", "The quick brown fox", "def main():"):
            out = c.post("/generate", json={"text": prompt, "sampling_params": {
                "temperature": 0, "max_new_tokens": MAX_NEW}}).json()
            ref = plain_greedy(prompt)
            assert out["output_ids"] == ref["output_ids"] and out["text"] == ref["text"]
            meta = out["meta_info"]
            assert meta["spec_verify_ct"] == len(meta["spec_accept_lengths"]) > 0
        metrics = scrape(c)
    assert metrics["sglang:spec_verify_ct_total"] > 0 and metrics["sglang:spec_accept_length"] > 1.0


def test_echo_logprobs_under_eagle3_equal_plain_decodings(radix_on, plain_greedy):
    """`/v1/completions` with `echo` and `logprobs` on the EAGLE-3 server: the prompt's logprobs (from the
    prefill's all-positions variant) and the completion's equal the plain engine's, which the engine tests
    hold against transformers' forward."""
    prompt = SYSTEM + "Human: list three colours."
    with httpx.Client(base_url=radix_on.url, timeout=120) as c:
        got = c.post("/v1/completions", json={"model": "any", "prompt": prompt, "max_tokens": 8,
                                              "temperature": 0, "echo": True, "logprobs": 2}).json()
    ref = plain_greedy(prompt, max_new_tokens=8, prompt_logprobs=True, return_logprob=True,
                       top_logprobs_num=2)["meta_info"]
    want = [lp for lp, _ in ref["input_token_logprobs"]] + [lp for lp, _ in ref["output_token_logprobs"]]
    lps = got["choices"][0]["logprobs"]["token_logprobs"]
    assert lps[0] is None and len(lps) == len(want)
    np.testing.assert_allclose(lps[1:], want[1:], atol=1e-4)
    # each position's top logprobs are the plain engine's top two (a dict keyed by text: two ids that
    # decode to the same text are one key)
    ref_tops = ref["input_top_logprobs"] + ref["output_top_logprobs"]
    tops = got["choices"][0]["logprobs"]["top_logprobs"]
    assert tops[0] is None and len(tops) == len(ref_tops)
    for top, ref_top in zip(tops[1:], ref_tops[1:], strict=True):
        want_values = [lp for lp, _ in ref_top]
        assert 1 <= len(top) <= 2 and max(top.values()) == pytest.approx(want_values[0], abs=1e-4)
        assert all(min(abs(v - w) for w in want_values) < 1e-4 for v in top.values())
