"""The shipped embedded checkpoint (jaxserve/assets/embedded): loads, fits the package-data budget, and the
draft head reads the captured layers its config names. Skipped until the checkpoint has been trained."""

import numpy as np
import pytest

from jaxserve.loader.load import load_model
from jaxserve.loader.tokenizer import HFTokenizer
from jaxserve.speculative.eagle3_checkpoint import load_eagle3_draft
from jaxserve.training.export import EMBEDDED_DIR, SIZE_BUDGET_BYTES, directory_bytes
from tests.models.helpers import Runner, full_logits
from tests.server.test_pr11231_verbatim import PREFIX_PROMPTS, TEST_PROMPT

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it


def test_embedded_checkpoint_is_shipped():
    assert (EMBEDDED_DIR / "model.safetensors").exists()
    assert (EMBEDDED_DIR / "draft" / "model.safetensors").exists()


def test_embedded_checkpoint_is_under_the_size_budget():
    assert directory_bytes(EMBEDDED_DIR) < SIZE_BUDGET_BYTES


def test_embedded_target_tokenizer_and_draft_load_together():
    tok = HFTokenizer(EMBEDDED_DIR)
    target = load_model(EMBEDDED_DIR, progress=False)
    assert target.config.architecture == "GptOssForCausalLM"
    assert tok.vocab_size == target.config.vocab_size
    head = load_eagle3_draft(EMBEDDED_DIR / "draft", target_num_layers=target.config.num_layers)
    assert head.config.vocab_size == target.config.vocab_size
    assert head.config.hidden_size == target.config.hidden_size


def test_embedded_target_continues_a_docstring_sensibly():
    """Greedy continuation of a stdlib-style phrase stays printable text (not a table or code dump)."""
    tok = HFTokenizer(EMBEDDED_DIR)
    runner = Runner(load_model(EMBEDDED_DIR, progress=False))
    ids = tok.encode("Return the number of", add_special_tokens=False)
    for _ in range(12):
        logits, _ = full_logits(runner, ids)
        ids.append(int(np.argmax(logits[-1])))
    text = tok.decode(ids)
    assert text.startswith("Return the number of")
    assert sum(c.isalpha() or c.isspace() for c in text) / len(text) > 0.8


PR_PROMPTS = [*PREFIX_PROMPTS, TEST_PROMPT, "You are a helpful assistant."]


def test_embedded_target_continues_ordinary_english_instead_of_ending():
    """SGLang PR #11231's prompts: the greedy next token is never eos, and the test prompt continues for 20
    tokens without one (the reference is a full-sequence forward per token, not the serving engine)."""
    tok = HFTokenizer(EMBEDDED_DIR)
    runner = Runner(load_model(EMBEDDED_DIR, progress=False))
    eos = set(tok.eos_token_ids)
    for prompt in PR_PROMPTS:
        logits, _ = full_logits(runner, tok.encode(prompt, add_special_tokens=False))
        assert int(np.argmax(logits[-1])) not in eos, prompt
    ids = tok.encode(TEST_PROMPT, add_special_tokens=False)
    for _ in range(20):
        logits, _ = full_logits(runner, ids)
        ids.append(int(np.argmax(logits[-1])))
        assert ids[-1] not in eos, tok.decode(ids)
