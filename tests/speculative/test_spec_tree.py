"""Tree drafting (speculative_eagle_topk > 1) is lossless: greedy output equals the plain engine's, with the
radix cache, page sizes 1 and 16, full-attention and hybrid SWA targets; accepted side branches move their
target KV into place (exercised: moves happen); no KV leak. (Sampled tree requests: test_spec_rejection.)"""

from __future__ import annotations

import numpy as np
import pytest

from tests.speculative import spec_pairs as sp

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

GREEDY = {"temperature": 0, "max_new_tokens": 30}


@pytest.mark.parametrize(("kind", "page_size", "topk", "steps", "num_draft"),
                         [("llama", 1, 3, 3, 8), ("llama", 16, 2, 2, 4), ("gpt_oss", 1, 3, 3, 8),
                          ("gpt_oss", 16, 4, 2, 6)])
def test_tree_greedy_output_equals_plain_greedy(kind, page_size, topk, steps, num_draft):
    prompts = sp.shared_prefix_prompts(seed=11 + page_size, n=6)
    ref = sp.plain_outputs(kind, prompts, GREEDY)
    engine = sp.engine(kind, page_size=page_size, num_steps=steps, speculative_eagle_topk=topk,
                       speculative_num_draft_tokens=num_draft)
    outs = engine.generate(input_ids=prompts[:3], sampling_params=GREEDY)
    outs += engine.generate(input_ids=prompts[3:], sampling_params=GREEDY)
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in ref]
    assert sum(o["meta_info"]["cached_tokens"] for o in outs[3:]) > 0
    assert engine.stepper.stats["tree_kv_moved"] > 0  # some accepted path left the first branch
    assert max(max(o["meta_info"]["spec_accept_lengths"]) for o in outs) <= steps
    engine.check_memory()
    engine.flush_cache()


def _host_select(tok, score, parent, num_nodes):
    """Reference: the N - 1 best candidates in candidate order, parents mapped to verify indices."""
    order = sorted(np.argsort(-score, kind="stable")[: num_nodes - 1].tolist())
    index = {-1: 0}
    tokens, parents = [-1], [-1]
    for c in order:
        if int(parent[c]) in index:
            index[c] = len(tokens)
            tokens.append(int(tok[c]))
            parents.append(index[int(parent[c])])
    return tokens, parents


@pytest.mark.parametrize(("steps", "topk", "nodes"), [(2, 2, 4), (3, 3, 8), (4, 2, 7), (1, 3, 3)])
def test_device_tree_selection_matches_a_host_reference(steps, topk, nodes):
    """`select_tree` on device against a plain host selection over random candidate trees whose scores
    decrease along every path (as log-probabilities do): same nodes, tokens, parents; depths and children
    consistent with the parents; the tree mask shows each node the prefix, the root and its own path."""
    import jax.numpy as jnp

    from jaxserve.speculative.draft_tree import candidate_depths, select_tree, tree_mask

    rng = np.random.default_rng(steps * 10 + topk)
    rows = 6
    depth_of = candidate_depths(steps, topk)
    num_cands = depth_of.shape[0]
    tok = rng.integers(0, 500, size=(rows, num_cands)).astype(np.int32)
    parent = np.full((rows, num_cands), -1, np.int32)
    score = np.zeros((rows, num_cands), np.float32)
    for r in range(rows):
        frontier = list(range(topk))
        score[r, :topk] = -np.sort(rng.random(topk))
        for s in range(1, steps):
            base = topk + (s - 1) * topk * topk
            for j in range(topk * topk):
                c = base + j
                parent[r, c] = frontier[j // topk]
                score[r, c] = score[r, parent[r, c]] - rng.random() - 0.01
            kids = list(range(base, base + topk * topk))
            frontier = sorted(kids, key=lambda c, r=r: -score[r, c])[:topk]
    last = np.arange(rows, dtype=np.int32) + 1000
    tokens, parents, depths, children = (np.asarray(x) for x in select_tree(
        jnp.asarray(tok), jnp.asarray(score), jnp.asarray(parent), jnp.asarray(last), num_nodes=nodes,
        num_steps=steps, topk=topk))
    for r in range(rows):
        ref_tok, ref_par = _host_select(tok[r], score[r], parent[r], nodes)
        assert tokens[r, 0] == last[r] and tokens[r, 1:].tolist() == ref_tok[1:]
        assert parents[r].tolist() == ref_par
        for v in range(1, nodes):
            assert depths[r, v] == depths[r, parents[r, v]] + 1
            assert v in children[r, parents[r, v]].tolist()
        assert sorted(c for c in children[r].reshape(-1).tolist() if c >= 0) == list(range(1, nodes))
    prefix = np.arange(rows, dtype=np.int32) * 3 + 2
    mask = np.asarray(tree_mask(jnp.asarray(parents), jnp.asarray(prefix), 64, steps))
    mask = mask.reshape(rows, nodes, 64)
    for r in range(rows):
        n = prefix[r]
        for v in range(nodes):
            path, u = {0}, v
            while u > 0:
                path.add(u)
                u = parents[r, u]
            expect = [j < n or (j - n) in path for j in range(64)]
            expect = [e and not (j >= n + nodes) for j, e in enumerate(expect)]
            assert mask[r, v].tolist() == expect
