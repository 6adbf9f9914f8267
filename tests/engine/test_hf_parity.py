"""Greedy generation equals transformers' generate(do_sample=False) on tiny random checkpoints."""

import pytest

from tests.engine.conftest import hf_greedy, make_engine, prompts

pytestmark = [pytest.mark.hf, pytest.mark.slow]


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


@pytest.mark.parametrize(("model_type", "overrides"), [
    ("qwen3", dict(head_dim=16)),
    ("gemma2", dict(num_hidden_layers=3, head_dim=16, sliding_window=8, query_pre_attn_scalar=24,
                    attn_logit_softcapping=3.0, final_logit_softcapping=5.0)),
])
def test_other_architectures_with_shared_prefixes_equal_transformers(tmp_path, model_type, overrides):
    from jaxserve.loader.load import load_model
    from tests.models.helpers import make_hf_checkpoint

    hf = make_hf_checkpoint(tmp_path, model_type, seed=2, **overrides)
    engine = make_engine(load_model(tmp_path, progress=False), page_size=16, chunked_prefill_size=32,
                         max_running_requests=4)
    base = prompts(3, [40])[0]
    batch = [base + p for p in prompts(4, [3, 11, 20])]
    first = engine.generate(input_ids=batch[0], sampling_params=GREEDY)
    rest = engine.generate(input_ids=batch[1:], sampling_params=GREEDY)
    assert [o["meta_info"]["cached_tokens"] for o in rest] == [32, 32]  # the prefix's whole pages
    for p, out in zip(batch, [first, *rest], strict=True):
        assert out["output_ids"] == hf_greedy(hf, p, 10)
