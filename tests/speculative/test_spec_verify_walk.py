"""The verify walk (`jaxserve.speculative.rejection.verify_tree`) against brute force on a 5-token
vocabulary: every emitted token follows the target distribution of the node that produced it (chi-square
over 20k independent seeds), for a branching tree and a chain; greedy rows follow the argmax path; penalties
count the drafted tokens on each node's path (checked against penalties applied by hand)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from scipy import stats

from jaxserve.sampling import SamplingParams, SamplingRow, build_sampling_batch, new_penalty_pool
from jaxserve.speculative.rejection import chain_children, chain_parents, path_nodes, verify_tree

V = 5
# tree: root 0 -> children 1 (token 2), 2 (token 0); node 1 -> child 3 (token 4); node 2 -> child 4 (token 1)
TOKENS = np.array([3, 2, 0, 4, 1], np.int32)
CHILDREN = np.array([[1, 2], [3, -1], [4, -1], [-1, -1], [-1, -1]], np.int32)
PARENTS = np.array([-1, 0, 0, 1, 2], np.int32)
DEPTH = np.array([0, 1, 1, 2, 2])
RNG = np.random.default_rng(0)
LOGITS = RNG.normal(size=(5, V)).astype(np.float32)
LOGITS[0, [2, 0]] += 1.0  # make every branch common enough to test
LOGITS[1, 4] += 1.5
LOGITS[2, 1] += 1.5


def _probs(logits, temperature=1.0):
    z = logits.astype(np.float64) / temperature
    p = np.exp(z - z.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


def _run(n, params, logits=LOGITS, tokens=TOKENS, children=CHILDREN, parents=PARENTS, depth=DEPTH,
         pool=None, penalty_row=None):
    nodes = len(tokens)
    rows = [SamplingRow(params, seed, 7 + int(depth[v]), penalty_row)
            for seed in range(n) for v in range(nodes)]
    batch = build_sampling_batch(rows, n * nodes)
    out = verify_tree(jnp.tile(jnp.asarray(logits), (n, 1)), jnp.tile(jnp.asarray(tokens), (n, 1)),
                      jnp.tile(jnp.asarray(children), (n, 1, 1)), batch, max_depth=int(depth.max()),
                      pool=pool, parents=None if pool is None else jnp.tile(jnp.asarray(parents), (n, 1)))
    return (np.asarray(out.num_accepted), np.asarray(out.emitted), np.asarray(out.path),
            np.asarray(out.logprobs))


def _chi2(observed_tokens, p):
    counts = np.bincount(observed_tokens, minlength=V).astype(float)
    expected = p * counts.sum()
    keep = expected > 0
    assert counts[~keep].sum() == 0
    return stats.chisquare(counts[keep], expected[keep]).pvalue


def test_every_emitted_token_follows_its_nodes_distribution():
    n = 20000
    acc, emitted, path, logprobs = _run(n, SamplingParams(temperature=1.0))
    probs = _probs(LOGITS)
    assert _chi2(emitted[:, 0], probs[0]) > 1e-3  # first token ~ p(root), whatever the tree
    for child in (1, 2):  # after accepting a depth-1 child, the next token ~ p(child)
        sel = path[:, 1] == child
        sel &= acc >= 1
        assert sel.sum() > 500
        assert (emitted[sel, 0] == TOKENS[child]).all()
        assert _chi2(emitted[sel, 1], probs[child]) > 1e-3
    for leaf in (3, 4):  # a leaf's bonus token ~ p(leaf)
        sel = (acc == 2) & (path[:, 2] == leaf)
        assert sel.sum() > 200
        assert _chi2(emitted[sel, 2], probs[leaf]) > 1e-3
    # the emitted token's logprob is the raw log-softmax at the node that produced it
    logp = np.log(probs)
    np.testing.assert_allclose(logprobs[:, 0], logp[0, emitted[:, 0]], rtol=1e-5, atol=1e-5)
    # accepted paths follow parent links
    two = acc == 2
    assert (PARENTS[path[two, 2]] == path[two, 1]).all()


def test_top_k_filter_and_chain():
    n = 20000
    nodes = 4
    logits = RNG.normal(size=(nodes, V)).astype(np.float32)
    tokens = np.array([0, int(np.argsort(-logits[0])[1]), 2, 3], np.int32)  # 2nd most likely draft first
    depth = np.arange(nodes)
    acc, emitted, path, _ = _run(n, SamplingParams(temperature=0.8, top_k=2), logits=logits, tokens=tokens,
                                 children=chain_children(nodes), parents=chain_parents(nodes), depth=depth)
    z = logits / 0.8
    p0 = np.zeros(V)
    top = np.argsort(-z[0])[:2]
    p0[top] = _probs(z[0][top])
    assert _chi2(emitted[:, 0], p0) > 1e-3
    assert 0.05 < (acc >= 1).mean() < 0.95
    assert (path[acc >= 1, 1] == 1).all()


def test_greedy_follows_the_argmax():
    acc, emitted, path, _ = _run(4, SamplingParams(temperature=0.0))
    am = LOGITS.argmax(-1)
    cur, expect, nodes = 0, [], [0]
    for _ in range(3):
        expect.append(int(am[cur]))
        nxt = [c for c in CHILDREN[cur] if c >= 0 and TOKENS[c] == am[cur]]
        if not nxt:
            break
        cur = nxt[0]
        nodes.append(cur)
    a = len(expect) - 1
    assert (acc == a).all()
    assert (emitted[:, : a + 1] == expect).all() and (path[:, : a + 1] == nodes).all()


def test_penalties_count_the_drafted_path():
    """Greedy with a frequency penalty of 2 and a rigged tree: root -> node 1 (token 2) -> node 3 (token 4)
    are the argmaxes; at node 3 the raw logits are [0, 0, 9, 8, 8.5]: token 2 (drafted at node 1) and token
    4 (node 3's own) are on the path, token 3 (the root's) is in the pool, so every one of them is
    penalised once: 7, 6, 6.5 -> token 2. Without the path counted it would be token 4 (8.5 vs 7, 6)."""
    logits = np.zeros((5, V), np.float32)
    logits[0, 2] = 5.0
    logits[1, 4] = 5.0
    logits[3] = [0.0, 0.0, 9.0, 8.0, 8.5]
    pool = new_penalty_pool(4, V)
    pool = pool.__class__(output_counts=pool.output_counts.at[1, 3].set(1), prompt_mask=pool.prompt_mask)
    params = SamplingParams(temperature=0.0, frequency_penalty=2.0)
    acc, emitted, _, _ = _run(2, params, logits=logits, pool=pool, penalty_row=1)
    assert (acc == 2).all()
    assert (emitted == [2, 4, 2]).all()
    # with 9 -> 7.6 at token 2, token 4 (8.5 - 2 = 6.5) still loses; with 6.4 it wins: the path counts
    logits[3, 2] = 8.4
    acc, emitted, _, _ = _run(2, params, logits=logits, pool=pool, penalty_row=1)
    assert (emitted[:, 2] == 4).all()
    # the root's token comes from the pool only: without the pool row's count, token 3 would win (8 > 6.5)
    empty = new_penalty_pool(4, V)
    acc, emitted, _, _ = _run(2, params, logits=logits, pool=empty, penalty_row=1)
    assert (emitted[:, 2] == 3).all()


def test_path_nodes():
    on = np.asarray(path_nodes(jnp.asarray(PARENTS[None]), 2))[0]
    expect = np.zeros((5, 5), bool)
    for v, path in {1: [1], 2: [2], 3: [1, 3], 4: [2, 4]}.items():
        expect[v, path] = True
    assert (on == expect).all()
    chain = np.asarray(path_nodes(jnp.asarray(chain_parents(4)[None]), 3))[0]
    assert (chain == np.tril(np.ones((4, 4), bool)) & (np.arange(4) > 0)[None, :]).all()


def test_greedy_rows_in_a_sampled_batch_match_the_greedy_walk():
    """A batch with any sampled row takes the general walk; its greedy rows must decide exactly what the
    draw-free greedy walk decides (random logits per request, so paths differ between rows)."""
    n, nodes = 64, len(TOKENS)
    logits = RNG.normal(size=(n * nodes, V)).astype(np.float32) * 3
    rows = [SamplingRow(SamplingParams(temperature=0.0 if r % 2 else 1.0), r, int(DEPTH[v]))
            for r in range(n) for v in range(nodes)]
    args = (jnp.asarray(logits), jnp.tile(jnp.asarray(TOKENS), (n, 1)),
            jnp.tile(jnp.asarray(CHILDREN), (n, 1, 1)))
    mixed = verify_tree(*args, build_sampling_batch(rows, n * nodes), max_depth=2)
    greedy_rows = [SamplingRow(SamplingParams(temperature=0.0), r, int(DEPTH[v]))
                   for r in range(n) for v in range(nodes)]
    greedy = verify_tree(*args, build_sampling_batch(greedy_rows, n * nodes), max_depth=2)
    odd = np.arange(n) % 2 == 1
    m_acc, g_acc = np.asarray(mixed.num_accepted), np.asarray(greedy.num_accepted)
    assert (m_acc[odd] == g_acc[odd]).all() and len(set(g_acc[odd].tolist())) > 1
    for r in np.flatnonzero(odd):
        a = g_acc[r] + 1
        assert (np.asarray(mixed.emitted)[r, :a] == np.asarray(greedy.emitted)[r, :a]).all()
        assert (np.asarray(mixed.path)[r, :a] == np.asarray(greedy.path)[r, :a]).all()
