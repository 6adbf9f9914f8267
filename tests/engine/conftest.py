"""Shared tiny checkpoints (built once per session) and engine helpers for the engine tests.

Steps compile once per bucket shape (seconds each on CPU), so tests use `SMALL_BUCKETS`-style overrides
and share one model object per checkpoint: engines over the same model reuse the jitted step.
"""

from __future__ import annotations

import numpy as np
import pytest

from jaxserve.api import Engine
from jaxserve.engine.step_input import Buckets
from jaxserve.loader.load import load_model
from tests.models.helpers import make_hf_checkpoint

GPT_OSS = dict(num_hidden_layers=3, head_dim=16, sliding_window=8, num_local_experts=4, num_experts_per_tok=2,
               intermediate_size=64, max_position_embeddings=512, swiglu_limit=1.5)


def write_byte_tokenizer(directory) -> None:
    """A byte-level tokenizer over exactly 256 ids (no merges): every byte string round-trips."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(directory / "tokenizer.json"))


@pytest.fixture(scope="session")
def llama(tmp_path_factory):
    """(hf_model, jaxserve model, checkpoint dir) of a tiny random Llama with a byte tokenizer."""
    path = tmp_path_factory.mktemp("llama")
    hf = make_hf_checkpoint(path, "llama", seed=0)
    write_byte_tokenizer(path)
    return hf, load_model(path, progress=False), path


@pytest.fixture(scope="session")
def gpt_oss(tmp_path_factory):
    """Tiny random gpt-oss (sliding window 8 on layers 0 and 2, sinks, MoE): hybrid pools + SWA tree."""
    path = tmp_path_factory.mktemp("gpt_oss")
    hf = make_hf_checkpoint(path, "gpt_oss", seed=1, **GPT_OSS)
    hf.config._experts_implementation = "eager"
    return hf, load_model(path, progress=False), path


def small_buckets(*, max_tokens: int, max_seqs: int, max_pages: int) -> Buckets:
    """Two token buckets, one sequence bucket, one page bucket: few compilations per engine config."""
    return Buckets((min(16, max_tokens), max_tokens) if max_tokens > 16 else (max_tokens,), (max_seqs,),
                   (max_pages,))


def make_engine(model, *, page_size=1, max_total_tokens=1024, chunked_prefill_size=64, max_running_requests=8,
                tokenizer=None, **kwargs) -> Engine:
    max_pages = min(-(-512 // page_size), max_total_tokens // page_size)
    buckets = small_buckets(max_tokens=chunked_prefill_size, max_seqs=max_running_requests,
                            max_pages=max_pages)
    return Engine(model=model, tokenizer=tokenizer, page_size=page_size, max_total_tokens=max_total_tokens,
                  chunked_prefill_size=chunked_prefill_size, max_running_requests=max_running_requests,
                  buckets=buckets, **kwargs)


def hf_greedy(hf_model, prompt, max_new_tokens: int) -> list[int]:
    """transformers' generate(do_sample=False), EOS disabled, new tokens only."""
    import torch

    with torch.no_grad():
        ids = torch.tensor([list(prompt)])
        out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def prompts(seed: int, lengths) -> list[list[int]]:
    rng = np.random.RandomState(seed)
    return [rng.randint(0, 256, size=n).tolist() for n in lengths]


def assert_no_leak(engine: Engine) -> None:
    """Idle engine: after flush_cache every slot is free again, and ownership was a partition before."""
    assert engine.idle
    counts = engine.check_memory()
    assert counts.get("live_only", counts.get("live_only_pages")) == 0
    engine.flush_cache()
    kv = engine.kv
    free = kv.allocator.full_available_size() if kv.hybrid else kv.allocator.available_size()
    assert free == kv.num_slots and kv.tree_slots() == 0
    if kv.hybrid:
        assert kv.allocator.swa_available_size() == kv.swa_num_pages * kv.page_size
