"""Logprobs under EAGLE-3 are the verified positions' target logprobs: greedy outputs, their logprobs and
top logprobs equal plain decoding's on the embedded default (whose plain logprobs tests/server checks
against transformers)."""

from __future__ import annotations

import numpy as np
import pytest

from jaxserve.api import Engine
from jaxserve.assets import EMBEDDED_MODEL_DIR

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

FLAGS = dict(page_size=16, max_total_tokens=4096, chunked_prefill_size=64, max_running_requests=8)
PROMPTS = ["The quick brown fox", "def main():", "Hello"]
PARAMS = {"temperature": 0, "max_new_tokens": 24, "return_logprob": True, "top_logprobs_num": 3}


@pytest.mark.slow
def test_speculative_logprobs_equal_plain_decoding():
    plain = Engine(model_path=str(EMBEDDED_MODEL_DIR), **FLAGS).generate(PROMPTS, PARAMS)
    spec = Engine(model_path=str(EMBEDDED_MODEL_DIR), speculative_algorithm="EAGLE3",
                  speculative_draft_model_path=str(EMBEDDED_MODEL_DIR / "draft"), **FLAGS).generate(PROMPTS,
                                                                                                   PARAMS)
    assert any(s["meta_info"]["spec_accept_length"] > 1.0 for s in spec)  # drafts were accepted
    for p, s in zip(plain, spec, strict=True):
        assert s["output_ids"] == p["output_ids"]
        lp_p, lp_s = (np.array([lp for lp, _ in o["meta_info"]["output_token_logprobs"]]) for o in (p, s))
        np.testing.assert_allclose(lp_s, lp_p, atol=1e-4)
        for top_p, top_s in zip(p["meta_info"]["output_top_logprobs"], s["meta_info"]["output_top_logprobs"],
                                strict=True):
            assert [t for _, t in top_s] == [t for _, t in top_p]
            np.testing.assert_allclose([v for v, _ in top_s], [v for v, _ in top_p], atol=1e-4)
