"""Layers as one `jax.lax.scan` over stacked parameters (`scan_layers`) against the unrolled layer loop of
the same model: same logits and greedy tokens, same EAGLE-3 aux hidden states, donated pools never copied."""

import re

import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.layers.attention_metadata import SequenceStep, build_attention_metadata
from jaxserve.models.build import random_model
from jaxserve.models.config import ModelConfig
from jaxserve.models.decoder import scan_layers
from jaxserve.models.layer_stack import LayerStack
from tests.models.helpers import Runner, paged_logits

BASE = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6, rope_theta=10000.0,
            max_position_embeddings=256)
WINDOW = 4
ARCHS = {
    "llama": dict(architectures=["LlamaForCausalLM"], model_type="llama"),
    "qwen3": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3"),
    "gpt_oss": dict(architectures=["GptOssForCausalLM"], model_type="gpt_oss", num_local_experts=4,
                    num_experts_per_tok=2, sliding_window=WINDOW, attention_bias=True,
                    num_hidden_layers=5, layer_types=["sliding_attention", "full_attention"] * 2
                    + ["sliding_attention"]),  # two (sliding, full) blocks and an unrolled tail layer
}


def _model(arch: str, **changes):
    return random_model(ModelConfig.from_dict({**BASE, **ARCHS[arch], **changes}), seed=1)


def test_period_follows_the_layer_pattern():
    assert scan_layers(_model("llama")).layers.period == 1
    stack = scan_layers(_model("gpt_oss")).layers
    assert (stack.period, stack.num_blocks, len(stack.tail)) == (2, 2, 1)
    gemma3_like = (["sliding_attention"] * 2 + ["full_attention"]) * 2 + ["sliding_attention"] * 2
    stack = scan_layers(_model("gpt_oss", num_hidden_layers=8, layer_types=gemma3_like)).layers
    assert (stack.period, stack.num_blocks, len(stack.tail)) == (3, 2, 2)
    # full layers first, then sliding ones: nothing shorter than the whole stack repeats
    qwen2 = _model("gpt_oss", num_hidden_layers=4,
                   layer_types=["full_attention"] * 2 + ["sliding_attention"] * 2)
    assert scan_layers(qwen2) is qwen2


def test_stack_reads_like_the_layer_list():
    model = _model("gpt_oss")
    stack = scan_layers(model).layers
    assert isinstance(stack, LayerStack) and len(stack) == 5 and not isinstance(model.layers, LayerStack)
    for i, (ours, ref) in enumerate(zip(stack, model.layers, strict=True)):
        assert ours.attn.cfg == ref.attn.cfg, i
        np.testing.assert_array_equal(ours.attn.q_proj.kernel[...], ref.attn.q_proj.kernel[...])
        np.testing.assert_array_equal(ours.mlp.down_proj[...], ref.mlp.down_proj[...])
    np.testing.assert_array_equal(stack[-2].attn.sinks[...], model.layers[3].attn.sinks[...])


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_scanned_logits_match_unrolled(arch):
    """Chunked prefill then decode, two sequences, shuffled pages (hybrid pools for gpt-oss)."""
    model = _model(arch)
    rng = np.random.RandomState(0)
    seqs = [rng.randint(0, 128, 21), rng.randint(0, 128, 11)]
    chunks = [[7, 6], [11]]
    ref = paged_logits(Runner(model), seqs, chunks, page_size=4, window=WINDOW)
    ours = paged_logits(Runner(scan_layers(model)), seqs, chunks, page_size=4, window=WINDOW)
    for a, b in zip(ours, ref, strict=True):
        assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max()
        np.testing.assert_array_equal(a.argmax(-1), b.argmax(-1))


def test_aux_hidden_states_match_unrolled():
    model = random_model(ModelConfig.from_dict({**BASE, **ARCHS["gpt_oss"]}), seed=1,
                         aux_hidden_state_layer_ids=(0, 1, 3, 4))
    ids = np.random.RandomState(2).randint(0, 128, 16).astype(np.int32)
    steps = [SequenceStep(16, 16, list(range(1, 5)), list(range(1, 5)))]  # layer 4: the unrolled tail
    outs = []
    for m in (model, scan_layers(model)):
        runner = Runner(m)
        meta = build_attention_metadata(steps, page_size=4, with_swa=True)
        pools = m.kv_layout.make_pools(8, 4, np.float32)
        _, _, aux = runner.forward(runner.params, ids, meta, pools)
        outs.append(np.asarray(aux))
    assert outs[0].shape == (16, 4 * BASE["hidden_size"])
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-6)


@pytest.mark.xla_optimized
@pytest.mark.parametrize("arch", ["llama", "gpt_oss"])
def test_scanned_step_keeps_pools_in_place(arch):
    """The compiled step scans (a while loop), aliases each donated pool to an output and never copies one:
    the pools are the scan carry."""
    model = scan_layers(_model(arch, num_hidden_layers=8,
                               **({"layer_types": ["sliding_attention", "full_attention"] * 4}
                                  if arch == "gpt_oss" else {})))
    runner = Runner(model)
    hybrid = model.kv_layout.hybrid
    pools = model.kv_layout.make_pools(300, 4, jnp.bfloat16)
    pages = list(range(1, 33))
    steps = [SequenceStep(100, 100, pages, pages if hybrid else None)]
    meta = build_attention_metadata(steps, page_size=4, with_swa=hybrid, page_buckets=(64,))
    hlo = runner.forward.lower(runner.params, np.zeros(meta.num_tokens, np.int32), meta,
                               pools).compile().as_text()
    assert re.search(r"\bwhile\(", hlo)
    assert "input_output_alias" in hlo
    shapes = {f"u16[{','.join(map(str, a.shape))}]" for a in (pools.full.data, pools.swa.data)} if hybrid \
        else {f"u16[{','.join(map(str, pools.data.shape))}]"}
    assert all(s in hlo for s in shapes)
    copies = [ln for ln in hlo.splitlines() if re.search(r"copy\(", ln) and any(s in ln for s in shapes)]
    assert not copies, copies[:3]
