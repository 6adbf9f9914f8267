"""The radix cache changes what is computed, never what is generated: outputs with the cache on equal the
cache-off reference for any arrival order, batch composition, chunk size and page size."""

import numpy as np
import pytest

from tests.engine.conftest import assert_no_leak, make_engine, prompts

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

GREEDY = {"temperature": 0.0, "max_new_tokens": 8, "ignore_eos": True}


def shared_prefix_prompts(seed: int, num: int, prefix_len: int) -> list[list[int]]:
    rng = np.random.RandomState(seed)
    prefix = rng.randint(0, 256, size=prefix_len).tolist()
    others = prompts(seed + 1, rng.randint(1, 20, size=num))
    # two prompts are exact repeats, one is a strict prefix of another: edge cases of the match rule
    out = [prefix + o for o in others]
    out[1] = list(out[0])
    out[2] = out[3][: prefix_len + 1]
    return out


def run_staggered(engine, batch, order, waves: int, steps_between: int, params=GREEDY):
    """Submit `batch` in `order`, split into `waves`, stepping the engine between waves; outputs by index."""
    rids = {}
    for wave in np.array_split(np.asarray(order), waves):
        for i in wave:
            rids[int(i)] = engine.submit(input_ids=batch[i], sampling_params=params)
        for _ in range(steps_between):
            engine.step()
    engine.run_until_idle()
    return [engine.output(rids[i]) for i in range(len(batch))]


@pytest.fixture(scope="module")
def reference(llama):
    _, model, _ = llama
    batch = shared_prefix_prompts(0, 10, 37)
    engine = make_engine(model, disable_radix_cache=True, disable_overlap_schedule=True)
    outs = engine.generate(input_ids=batch, sampling_params=GREEDY)
    assert all(o["meta_info"]["cached_tokens"] == 0 for o in outs)
    return batch, [o["output_ids"] for o in outs]


@pytest.mark.parametrize(("page_size", "chunk", "waves", "seed"),
                         [(1, 64, 1, 0), (1, 16, 3, 1), (16, 64, 4, 2), (16, 16, 2, 3)])
def test_cache_on_equals_cache_off(llama, reference, page_size, chunk, waves, seed):
    _, model, _ = llama
    batch, expected = reference
    engine = make_engine(model, page_size=page_size, chunked_prefill_size=chunk, max_running_requests=4)
    order = np.random.RandomState(seed).permutation(len(batch))
    outs = run_staggered(engine, batch, order, waves, steps_between=3)
    assert [o["output_ids"] for o in outs] == expected
    cached = [o["meta_info"]["cached_tokens"] for o in outs]
    assert max(cached) >= 37 - 37 % page_size  # later arrivals reuse the shared prefix
    assert all(c % page_size == 0 and c < len(p) for c, p in zip(cached, batch, strict=True))
    assert_no_leak(engine)


def test_cache_cuts_computed_prompt_tokens_by_the_shared_share(llama):
    _, model, _ = llama
    rng = np.random.RandomState(5)
    prefix = rng.randint(0, 256, size=48).tolist()
    batch = [prefix + s for s in prompts(6, [16] * 6)]
    on = make_engine(model)
    off = make_engine(model, disable_radix_cache=True)
    first = on.generate(input_ids=batch[0], sampling_params=GREEDY)  # warms the tree with the prefix
    rest_on = on.generate(input_ids=batch[1:], sampling_params=GREEDY)
    outs_off = off.generate(input_ids=batch, sampling_params=GREEDY)
    assert [first["output_ids"]] + [o["output_ids"] for o in rest_on] == [o["output_ids"] for o in outs_off]
    assert off.num_prompt_tokens_computed == 64 * 6
    assert on.num_prompt_tokens_computed == 64 + 16 * 5  # the prefix is computed once
    assert [o["meta_info"]["cached_tokens"] for o in rest_on] == [48] * 5


@pytest.mark.parametrize("page_size", [1, 16])
def test_swa_model_cache_on_equals_cache_off(gpt_oss, page_size):
    """gpt-oss (window 8): the SWA tree's window rule and tombstones keep outputs equal to no caching."""
    _, model, _ = gpt_oss
    batch = shared_prefix_prompts(7, 8, 29)
    off = make_engine(model, page_size=page_size, disable_radix_cache=True, chunked_prefill_size=16)
    expected = [o["output_ids"] for o in off.generate(input_ids=batch, sampling_params=GREEDY)]
    on = make_engine(model, page_size=page_size, chunked_prefill_size=16, max_running_requests=4)
    outs = run_staggered(on, batch, np.random.RandomState(page_size).permutation(len(batch)), 3, 2)
    assert [o["output_ids"] for o in outs] == expected
    assert max(o["meta_info"]["cached_tokens"] for o in outs) > 0
    assert_no_leak(on)
