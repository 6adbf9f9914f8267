"""The low-level API drives a user's own Flax NNX model in a plain Python loop (no Engine)."""

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxserve.engine.kv_cache import KVCache
from jaxserve.engine.request import make_request
from jaxserve.engine.runner import ModelRunner
from jaxserve.engine.scheduler import Scheduler
from jaxserve.engine.step_input import Buckets, build_step_input
from jaxserve.layers.attention import Attention, AttentionConfig
from jaxserve.layers.rotary import RopeParams, RotaryEmbedding
from jaxserve.models.config import ModelConfig
from jaxserve.models.kv_layout import KVLayout
from jaxserve.sampling import SamplingParams
from tests.engine.conftest import prompts
from tests.models.helpers import Runner, full_logits

CONFIG = ModelConfig.from_dict(dict(
    architectures=["UserLM"], vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
    num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=256))


class UserLM(nnx.Module):
    """Someone's own model: an embedding, one jaxserve attention layer with rotary, a norm, tied logits."""

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        self.config, self.kv_layout = config, KVLayout.from_config(config)
        self.embed = nnx.Embed(config.vocab_size, config.hidden_size, rngs=rngs)
        attn = AttentionConfig(hidden_size=32, num_heads=2, num_kv_heads=1, head_dim=16)
        self.attn = Attention(attn, RotaryEmbedding.from_params(RopeParams(), 16, 256), dtype=jnp.float32,
                              rngs=rngs)
        self.norm = nnx.RMSNorm(config.hidden_size, rngs=rngs)

    def __call__(self, input_ids, meta, kv_pools, return_all_logits=False):
        x = self.embed(input_ids)
        h, kv_pools = self.attn(x, meta, kv_pools, 0)
        x = self.norm(x + 3.0 * h)
        if not return_all_logits:
            x = x[meta.sample_idx]
        return self.embed.attend(x), kv_pools, None


def greedy_reference(runner, prompt, num):
    """Full recompute per token (one single-sequence step of the whole sequence), argmax."""
    seq = list(prompt)
    for _ in range(num):
        logits, _ = full_logits(runner, seq)
        seq.append(int(np.argmax(logits[-1])))
    return seq[len(prompt):]


def test_plain_loop_over_the_parts_with_a_user_model():
    model = UserLM(CONFIG, nnx.Rngs(0))
    kv = KVCache(model.config, num_pages=24, page_size=4, kv_dtype=jnp.float32, disable_radix_cache=False)
    buckets = Buckets((16, 32), (4,), (16,))
    runner = ModelRunner(model, kv, buckets, num_penalty_rows=4)
    sched = Scheduler(kv, max_tokens=32, max_running=4, set_penalty_row=runner.set_penalty_row)
    batch_prompts = [p % 128 for p in map(np.asarray, prompts(40, [6, 30, 11, 19, 25]))]
    params = SamplingParams(temperature=0, max_new_tokens=8)
    reqs = [make_request(f"r{i}", p, params, tree_root=kv.tree.root, seed=i)
            for i, p in enumerate(batch_prompts)]
    for req in reqs:
        sched.add(req)
    finished = []
    while not sched.idle:
        batch = sched.schedule()
        out = runner.run(build_step_input(batch, kv, buckets))
        finished += sched.process(batch, np.asarray(out.token_ids), np.asarray(out.logprobs))
        kv.check([r.cached for r in sched.running])
    assert sorted(r.rid for r in finished) == sorted(r.rid for r in reqs)
    reference = Runner(model)
    for req, prompt in zip(reqs, batch_prompts, strict=True):
        assert req.output_ids == greedy_reference(reference, prompt.tolist(), 8)
    kv.flush()
    assert kv.allocator.available_size() == kv.num_slots
