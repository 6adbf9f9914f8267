"""`--mem-fraction-static` planning: with a fake device-memory figure the KV pool follows the formula of
`jaxserve.engine.memory_plan` (checked against the bytes of the pools actually built), the engine sizes its
pools from the plan and prints it, and an explicit max_total_tokens still wins."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.engine.memory_plan import MemoryPlanError, plan_kv_pools
from jaxserve.models.build import random_model
from jaxserve.models.config import ModelConfig
from jaxserve.models.kv_layout import KVLayout

MIB = 1 << 20
LLAMA = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=128, hidden_size=32,
             intermediate_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
             head_dim=8, rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=256)
HYBRID = KVLayout(num_layers=6, swa_layer_ids=(0, 2, 4), num_kv_heads=2, head_dim=16)


def _built_bytes(layout: KVLayout, plan, dtype) -> int:
    """Bytes of the pools `layout.make_pools` would build for `plan` (shapes only, nothing allocated)."""
    pools = jax.eval_shape(lambda: layout.make_pools(plan.num_pages, plan.page_size, dtype,
                                                     swa_num_pages=plan.swa_num_pages))
    return sum(int(np.prod(a.shape)) * a.dtype.itemsize for a in jax.tree.leaves(pools))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_single_pool_fills_the_static_fraction(dtype):
    layout = KVLayout.from_config(ModelConfig.from_dict(LLAMA))
    plan = plan_kv_pools(layout, fraction=0.5, device_bytes=1000 * MIB, free_bytes=900 * MIB,
                         weight_bytes=100 * MIB, activation_bytes=10 * MIB, page_size=16, kv_dtype=dtype)
    budget = 500 * MIB - 100 * MIB  # the static fraction binds: 0.5 * 1000 - weights < 900 - 10
    page_all_layers = 16 * 2 * 2 * 8 * jnp.dtype(dtype).itemsize * 4
    assert plan.pool_bytes == _built_bytes(layout, plan, dtype)
    assert plan.pool_bytes <= budget < plan.pool_bytes + page_all_layers
    assert plan.max_total_tokens == plan.num_pages * 16
    assert plan.headroom_bytes == 900 * MIB - plan.pool_bytes
    assert plan.swa_num_pages is None


def test_activation_peak_binds_when_free_memory_is_short():
    layout = KVLayout.from_config(ModelConfig.from_dict(LLAMA))
    plan = plan_kv_pools(layout, fraction=0.9, device_bytes=1000 * MIB, free_bytes=300 * MIB,
                         weight_bytes=100 * MIB, activation_bytes=50 * MIB, page_size=4,
                         kv_dtype=jnp.bfloat16)
    page_all_layers = 4 * 2 * 2 * 8 * 2 * 4
    assert plan.pool_bytes <= 250 * MIB < plan.pool_bytes + page_all_layers
    assert plan.headroom_bytes >= 50 * MIB


def test_hybrid_pools_split_by_the_swa_ratio():
    plan = plan_kv_pools(HYBRID, fraction=0.8, device_bytes=100 * MIB, free_bytes=95 * MIB, weight_bytes=0,
                         activation_bytes=MIB, page_size=8, kv_dtype=jnp.bfloat16, swa_full_tokens_ratio=0.25)
    assert plan.pool_bytes == _built_bytes(HYBRID, plan, jnp.bfloat16) <= 80 * MIB
    assert plan.pool_bytes > 0.99 * 80 * MIB  # whole pages only: less than one page per layer is left over
    assert abs(plan.swa_num_pages - 0.25 * plan.num_pages) <= 1


def test_too_little_memory_names_the_figures():
    layout = KVLayout.from_config(ModelConfig.from_dict(LLAMA))
    with pytest.raises(MemoryPlanError, match="weights of 900"):
        plan_kv_pools(layout, fraction=0.9, device_bytes=1000, free_bytes=100, weight_bytes=900,
                      activation_bytes=0, page_size=1, kv_dtype=jnp.float32)


def test_engine_sizes_its_pool_from_the_plan(monkeypatch, capsys):
    import jaxserve.api as api

    model = random_model(ModelConfig.from_dict(LLAMA), seed=0)
    monkeypatch.setattr(api, "device_memory", lambda: (64 * MIB, 60 * MIB))
    kwargs = dict(model=model, page_size=4, chunked_prefill_size=32, max_running_requests=2)
    engine = api.Engine(mem_fraction_static=0.5, **kwargs)
    plan = engine.memory_plan
    weights = sum(a.nbytes for a in jax.tree.leaves(engine.runner.params))
    assert plan.weight_bytes == weights and plan.activation_bytes > 0
    assert plan.pool_bytes <= min(32 * MIB - weights, 60 * MIB - plan.activation_bytes)
    assert engine.kv.num_pages == plan.num_pages and engine.kv.pools.nbytes == plan.pool_bytes
    out = capsys.readouterr().out
    assert f"{plan.max_total_tokens} tokens fit" in out and "--mem-fraction-static 0.5" in out
    assert engine.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 2})["output_ids"]
    explicit = api.Engine(mem_fraction_static=0.5, max_total_tokens=256, **kwargs)
    assert explicit.memory_plan is None and explicit.kv.num_pages == 64
