"""Tree drafting (speculative_eagle_topk > 1) is lossless: greedy output equals the plain engine's, with the
radix cache, page sizes 1 and 16, full-attention and hybrid SWA targets; accepted side branches move their
target KV into place (exercised: moves happen); no KV leak. (Sampled tree requests: test_spec_rejection.)"""

from __future__ import annotations

import pytest

from tests.speculative import spec_pairs as sp

GREEDY = {"temperature": 0, "max_new_tokens": 30}


@pytest.mark.parametrize(("kind", "page_size", "topk", "steps", "num_draft"),
                         [("llama", 1, 3, 3, 8), ("llama", 16, 2, 2, 4), ("gpt_oss", 1, 3, 3, 8),
                          ("gpt_oss", 16, 4, 2, 6)])
def test_tree_greedy_output_equals_plain_greedy(kind, page_size, topk, steps, num_draft):
    prompts = sp.shared_prefix_prompts(seed=11 + page_size, n=6)
    ref = sp.engine(kind, which=None).generate(input_ids=prompts, sampling_params=GREEDY)
    engine = sp.engine(kind, page_size=page_size, num_steps=steps, speculative_eagle_topk=topk,
                       speculative_num_draft_tokens=num_draft)
    outs = engine.generate(input_ids=prompts[:3], sampling_params=GREEDY)
    outs += engine.generate(input_ids=prompts[3:], sampling_params=GREEDY)
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in ref]
    assert sum(o["meta_info"]["cached_tokens"] for o in outs[3:]) > 0
    assert engine.spec.stats["tree_kv_moved"] > 0  # some accepted path left the first branch
    assert max(max(o["meta_info"]["spec_accept_lengths"]) for o in outs) <= steps
    engine.check_memory()
    engine.flush_cache()
