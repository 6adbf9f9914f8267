"""SGLang PR #11231's accept-length test, typed as a user types it against the main job.

The server is `python -m jaxserve.launch_server` with the PR's flags, on the embedded default (its EAGLE-3
head found without a draft path, `--attention-backend triton` mapped onto ours); the requests are the PR's
nine `send_one --prompt "... xxx" --max-new-tokens 3` calls that build a chain of radix nodes, then the test
prompt with `--max-new-tokens 20`, each a `python -m jaxserve.test.send_one` subprocess whose printed
`acc_length=` line is parsed. Then the same with `--disable-radix-cache`. No `ignore_eos`: the shipped model
must continue the prompt for all 20 tokens by itself, and with bigram keys the prefix hit must not change
what the draft sees, so both runs print the same text and the same acc_length, above 1.3 (the PR shows
1.33 on gpt-oss-20b). A third run with the hidden `--debug-token-keys` (the tree keyed by tokens, as before
the fix) prints the acc_length the bug costs; its text must still be the same (verification is lossless).
"""

from __future__ import annotations

import re

import httpx
import pytest

from tests.server.conftest import ServerProcess
from tests.server.test_cli import run_send_one
from tests.server.test_load import scrape

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

PR_SERVER_FLAGS = ["--attention-backend", "triton", "--speculative-algorithm", "EAGLE3",
                   "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
                   "--speculative-num-draft-tokens", "3"]
PREFIX_PROMPTS = ["You xxx", "You are xxx", "You are a xxx", "You are a helpful xxx",
                  "You are a helpful, xxx",
                  "You are a helpful, respectful xxx", "You are a helpful, respectful and xxx",
                  "You are a helpful, respectful and honest xxx",
                  "You are a helpful, respectful and honest assistant xxx"]
TEST_PROMPT = "You are a helpful, respectful and honest assistant."


def parse_send_one(stdout: str) -> tuple[str, float, int]:
    """(text, acc_length, completion tokens) from send_one's output: the text, `acc_length=X.XX`,
    `speed=X.XX token/s`, then the table whose second data cell is the token count."""
    lines = stdout.rstrip("\n").split("\n")
    acc_at = max(i for i, line in enumerate(lines) if line.startswith("acc_length="))
    assert re.fullmatch(r"speed=\d+\.\d\d token/s", lines[acc_at + 1])
    tokens = int(lines[-2].strip("|").split("|")[1])
    return "\n".join(lines[:acc_at]), float(lines[acc_at].split("=", 1)[1]), tokens


def run_pr_scenario(*extra_flags: str) -> tuple[str, float, int, float, list[str]]:
    """(test prompt's text, acc_length, tokens, prompt tokens served from the prefix cache, server log)."""
    proc = ServerProcess([*PR_SERVER_FLAGS, *extra_flags])
    try:
        for prompt in PREFIX_PROMPTS:
            run_send_one(proc, "--prompt", prompt, "--max-new-tokens", "3")
        with httpx.Client(base_url=proc.url) as client:
            cached_before = _cached_tokens(scrape(client))
            text, acc_length, tokens = parse_send_one(run_send_one(proc, "--prompt", TEST_PROMPT,
                                                                   "--max-new-tokens", "20"))
            cached = _cached_tokens(scrape(client)) - cached_before
    finally:
        assert proc.stop() == 0, "".join(proc.stderr[-20:])
    return text, acc_length, tokens, cached, proc.stderr


def _cached_tokens(samples: dict[str, float]) -> float:
    return sum(v for name, v in samples.items() if name.endswith("cached_tokens_total"))


@pytest.mark.slow
def test_pr11231_accept_length_test_typed_verbatim():
    text_on, acc_on, tokens_on, cached_on, log_on = run_pr_scenario()
    text_off, acc_off, tokens_off, cached_off, _ = run_pr_scenario("--disable-radix-cache")
    # the pre-fix behaviour (tree keyed by tokens): still lossless, but the prefix hit serves stale draft KV
    text_tok, acc_tok, tokens_tok, cached_tok, _ = run_pr_scenario("--debug-token-keys")
    print(f"PR #11231 scenario: acc_length radix on {acc_on:.2f} ({cached_on:.0f} cached prompt tokens), "
          f"off {acc_off:.2f}, token keys {acc_tok:.2f} ({cached_tok:.0f} cached); text {text_on!r}")
    assert text_tok == text_on and tokens_tok == 20
    assert cached_on > 0 and cached_off == 0  # the test prompt hit the chain the nine prompts built
    assert any("using the embedded EAGLE-3 head" in line for line in log_on)
    assert any("--attention-backend triton" in line for line in log_on)
    assert tokens_on == tokens_off == 20
    assert text_on == text_off
    assert acc_on == acc_off > 1.3
