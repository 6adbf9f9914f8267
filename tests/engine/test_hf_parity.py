"""Greedy generation equals transformers' generate(do_sample=False) on tiny random checkpoints."""

import pytest

from tests.engine.conftest import hf_greedy, make_engine, prompts

pytestmark = pytest.mark.hf
GREEDY = {"temperature": 0.0, "max_new_tokens": 10, "ignore_eos": True}


def test_llama_batched_greedy_equals_transformers(llama):
    hf, model, _ = llama
    batch = prompts(0, [3, 17, 40, 9, 70])  # 70 > chunk: prefilled over several steps
    engine = make_engine(model, chunked_prefill_size=32, max_running_requests=4)
    outs = engine.generate(input_ids=batch, sampling_params=GREEDY)
    for p, out in zip(batch, outs, strict=True):
        assert out["output_ids"] == hf_greedy(hf, p, 10)
        assert out["meta_info"]["completion_tokens"] == 10
        assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 10}


@pytest.mark.parametrize("page_size", [1, 16])
def test_gpt_oss_greedy_equals_transformers_past_the_window(gpt_oss, page_size):
    hf, model, _ = gpt_oss
    batch = prompts(1, [5, 30, 13])  # the window is 8: every prompt but the first leaves it
    engine = make_engine(model, page_size=page_size, chunked_prefill_size=16, max_running_requests=4)
    assert engine.kv.hybrid
    outs = engine.generate(input_ids=batch, sampling_params={**GREEDY, "max_new_tokens": 12})
    for p, out in zip(batch, outs, strict=True):
        assert out["output_ids"] == hf_greedy(hf, p, 12)


def test_engine_from_a_checkpoint_directory_decodes_text(llama):
    hf, _, path = llama
    from jaxserve import Engine
    from jaxserve.loader.tokenizer import HFTokenizer

    engine = Engine(str(path), max_total_tokens=512, chunked_prefill_size=64, max_running_requests=4)
    tokenizer = HFTokenizer(path)
    out = engine.generate("Hello, world", {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True})
    assert out["output_ids"] == hf_greedy(hf, tokenizer.encode("Hello, world"), 8)
    assert out["text"] == tokenizer.decode(out["output_ids"])
    assert out["meta_info"]["prompt_tokens"] == len("Hello, world")  # byte tokenizer: one id per byte
