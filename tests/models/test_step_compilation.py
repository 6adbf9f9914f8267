"""The jitted step compiles once per shape bucket and donates the KV pools."""

import jax
import numpy as np
import pytest

from jaxserve.layers.attention_metadata import SequenceStep, build_attention_metadata
from jaxserve.models.build import random_model
from jaxserve.models.config import ModelConfig
from jaxserve.models.step import make_forward

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

CONFIG = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=128, hidden_size=32,
              intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              rms_norm_eps=1e-6, rope_theta=10000.0)
TOKEN_BUCKETS, SEQ_BUCKETS, PAGE_BUCKETS = (16, 32, 64), (1, 2, 4), (16, 64)
PAGE_SIZE = 4


@pytest.fixture(scope="module")
def step():
    model = random_model(ModelConfig.from_dict(CONFIG), seed=0)
    forward, params = make_forward(model)
    return model, forward, params


def _meta(lengths, decode: bool):
    steps = []
    for i, n in enumerate(lengths):
        pages = list(range(1 + 16 * i, 17 + 16 * i))
        steps.append(SequenceStep(1 if decode else n, n, pages))
    return build_attention_metadata(steps, page_size=PAGE_SIZE, token_buckets=TOKEN_BUCKETS,
                                    seq_buckets=SEQ_BUCKETS, page_buckets=PAGE_BUCKETS)


def test_compilations_are_bounded_by_the_bucket_set(step):
    model, forward, params = step
    pools = model.kv_layout.make_pools(64, PAGE_SIZE, np.float32)
    rng = np.random.RandomState(0)
    seen, raw = set(), set()
    for _ in range(2):  # the second pass over the same kinds of steps must not compile anything new
        for _ in range(12):
            num_seqs = int(rng.randint(1, 4))
            lengths = rng.randint(1, 21, size=num_seqs).tolist()
            for decode in (False, True):
                meta = _meta(lengths, decode)
                ids = rng.randint(0, 128, size=meta.num_tokens).astype(np.int32)
                logits, pools, _ = forward(params, ids, meta, pools)
                assert logits.shape == (meta.num_seqs, 128)
                seen.add((meta.num_tokens, meta.num_seqs, meta.page_table.shape[1]))
                raw.add((len(lengths) if decode else sum(lengths), len(lengths), max(lengths)))
        compiled_after_pass = forward._cache_size()
    assert compiled_after_pass == len(seen)
    assert len(seen) <= len(TOKEN_BUCKETS) * len(SEQ_BUCKETS) * len(PAGE_BUCKETS)
    assert len(seen) < len(raw) / 2  # many raw step shapes collapse onto a few buckets


def test_kv_pools_are_donated(step):
    model, forward, params = step
    pools = model.kv_layout.make_pools(64, PAGE_SIZE, np.float32)
    before = pools.data
    meta = _meta([5], decode=False)
    _, new_pools, _ = forward(params, np.zeros(meta.num_tokens, np.int32), meta, pools)
    assert before.is_deleted()
    assert not new_pools.data.is_deleted()


@pytest.mark.xla_optimized
@pytest.mark.parametrize("hybrid", [False, True])
def test_compiled_step_never_copies_a_pool(hybrid):
    """Write-before-read per layer keeps the donated pools in place: no `copy` of a pool-shaped array
    (an unrolled layer loop can otherwise make XLA copy the pool once per layer; see memory/kv_pool.py)."""
    import re

    import jax.numpy as jnp

    raw = dict(CONFIG, num_hidden_layers=4)
    if hybrid:
        raw.update(architectures=["Qwen2ForCausalLM"], model_type="qwen2", use_sliding_window=True,
                   sliding_window=4, max_window_layers=2)
    model = random_model(ModelConfig.from_dict(raw), seed=0)
    assert model.kv_layout.hybrid == hybrid
    forward, params = make_forward(model)
    pools = model.kv_layout.make_pools(300, PAGE_SIZE, jnp.bfloat16)
    pages = list(range(1, 33))  # a 100-token prefill: 128-token bucket, attention in two token blocks
    steps = [SequenceStep(100, 100, pages, pages if hybrid else None)]
    meta = build_attention_metadata(steps, page_size=PAGE_SIZE, with_swa=hybrid, page_buckets=PAGE_BUCKETS)
    hlo = forward.lower(params, np.zeros(meta.num_tokens, np.int32), meta, pools).compile().as_text()
    shapes = {f"u16[{','.join(map(str, a.shape))}]" for a in jax.tree.leaves(pools)}
    assert len(shapes) == 1 and all(s in hlo for s in shapes)  # bf16 stored as uint16, one shape
    copies = [ln for ln in hlo.splitlines() if re.search(r"copy\(", ln) and any(s in ln for s in shapes)]
    assert not copies, copies[:3]
