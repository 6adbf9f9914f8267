"""Speculative tree verification through the model: candidates stored at consecutive key indices, rope
positions by tree depth, a custom mask of ancestors - same logits as running each branch as a sequence."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.layers.attention_metadata import SequenceStep, build_attention_metadata
from jaxserve.models.build import random_model
from jaxserve.models.config import ModelConfig
from jaxserve.models.step import make_forward

CONFIG = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=128, hidden_size=32,
              intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              head_dim=8, rope_theta=10000.0)
PREFIX = 11
PARENTS = [-1, 0, 0, 1, 2, 2]  # candidate tree (indices into the candidates)
PAGE_SIZE = 4


@pytest.fixture(scope="module")
def step():
    model = random_model(ModelConfig.from_dict(CONFIG), seed=1)
    forward, params = make_forward(model)
    return model, forward, params


def _run(model, forward, params, steps_tokens, pools, **meta_kwargs):
    steps, tokens = steps_tokens
    meta = build_attention_metadata(steps, page_size=PAGE_SIZE, **meta_kwargs)
    ids = np.zeros(meta.num_tokens, np.int32)
    ids[: len(tokens)] = tokens
    logits, pools, _ = forward(params, ids, meta, pools, return_all_logits=True)
    return np.asarray(logits)[: len(tokens)], pools


def _ancestors(c):
    path = []
    while c >= 0:
        path.append(c)
        c = PARENTS[c]
    return path[::-1]


def test_tree_step_matches_each_branch_run_as_a_sequence(step):
    model, forward, params = step
    rng = np.random.RandomState(0)
    prefix = rng.randint(0, 128, PREFIX)
    cand = rng.randint(0, 128, len(PARENTS))
    pages = list(range(1, 9))
    pools = model.kv_layout.make_pools(16, PAGE_SIZE, np.float32)
    _, pools = _run(model, forward, params, ([SequenceStep(PREFIX, PREFIX, pages)], prefix), pools)
    pools_copy = jax.tree.map(jnp.copy, pools)  # the steps below donate their pools

    depth = [len(_ancestors(c)) - 1 for c in range(len(PARENTS))]
    mask = np.zeros((len(PARENTS), PREFIX + len(PARENTS)), bool)
    mask[:, :PREFIX] = True
    for c in range(len(PARENTS)):
        mask[c, [PREFIX + a for a in _ancestors(c)]] = True
    num_cand = len(PARENTS)
    tree_step = SequenceStep(num_cand, PREFIX + num_cand, pages, positions=[PREFIX + d for d in depth])
    tree_logits, _ = _run(model, forward, params, ([tree_step], cand), pools, custom_mask=mask)

    for c in range(len(PARENTS)):
        branch = np.concatenate([prefix, cand[_ancestors(c)]])
        fresh = model.kv_layout.make_pools(16, PAGE_SIZE, np.float32)
        branch_step = SequenceStep(len(branch), len(branch), pages)
        want, _ = _run(model, forward, params, ([branch_step], branch), fresh)
        np.testing.assert_allclose(tree_logits[c], want[-1], atol=1e-5, err_msg=f"candidate {c}")
    # and the mask matters: plain causal attention over the candidates gives different logits
    causal_step = SequenceStep(num_cand, PREFIX + num_cand, pages)
    causal, _ = _run(model, forward, params, ([causal_step], cand), pools_copy)
    assert np.abs(causal[2:] - tree_logits[2:]).max() > 1e-3
