"""Verification of a draft tree (a chain is a tree with one child per node): greedy matching, or exact
rejection sampling for sampled requests, in one jittable walk with no host sync.

The tree's nodes are the verify positions of a request: node 0 is the root (the last known token), every
other node a drafted token whose parent comes before it. The drafts are the draft model's top tokens, so the
proposal at a node is a point mass on each child's token, and siblings carry distinct tokens.

At the current node u, let p be the target distribution there: the request's penalties (counting the
drafted tokens from the root to u, u included), temperature and top-k / top-p / min-p filters applied. The
children are tried in order: child c with token t is accepted with probability r(t) / sum(r), where r is p
with the tokens of the children already rejected set to 0; after an acceptance the walk moves to c. When
every child is rejected, the emitted token is drawn from r (the residual); at a leaf it is drawn from p (the
bonus token). Each step emits a token distributed exactly as p: P(t_1) = p(t_1),
P(t_2) = (1 - p(t_1)) * p(t_2) / (1 - p(t_1)) = p(t_2), ..., and a token no child carries gets
(1 - sum over children of p) * p(t) / (1 - sum over children of p) = p(t). Hence the output is distributed
as sampling from the target token by token. Greedy rows (temperature 0) use p = one-hot(argmax of the
penalised logits): a child is accepted iff it is the argmax, and the correction is the argmax.

Randomness: the node at depth d of a request that has generated g tokens uses the key of output index g + d
(`SamplingRow.num_generated = g + d`, the seed scheme of `jaxserve.sampling`); child k's accept test folds in
k, the residual draw folds in K (the branching). A round consumes output indices up to its first rejection,
and the next round starts after it.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.sampling.batch import NO_PENALTY_ROW, SamplingBatch
from jaxserve.sampling.constraints import apply_logit_bias, apply_token_bitmask
from jaxserve.sampling.filters import apply_filters
from jaxserve.sampling.logprobs import top_logprobs
from jaxserve.sampling.penalties import PenaltyPool, penalise, update_counts
from jaxserve.sampling.sampler import draw_tokens, row_keys


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Verdict:
    """What a verify walk decided, per request row r and step j = 0 .. D (D = the tree's depth).

    num_accepted i32[R]: drafts accepted (a); the round emits a + 1 tokens.
    emitted i32[R, D+1]: the accepted drafts' tokens, then the correction or bonus token (valid for j <= a).
    logprobs f32[R, D+1]: log-probability of `emitted[r, j]` under the raw logits of the node that produced
      it (before penalties, temperature and filters, as `SampleOutput.logprobs`).
    path i32[R, D+1]: the node (verify index within the row) whose logits gave `emitted[r, j]`: the root,
      then the accepted nodes (valid for j <= a).
    top_ids i32[R, D+1, K] / top_logprobs f32[R, D+1, K]: that node's most likely tokens under the raw
      logits (as `SampleOutput.top_ids`; zeros when no row asks for them).
    """

    num_accepted: jax.Array
    emitted: jax.Array
    logprobs: jax.Array
    path: jax.Array
    top_ids: jax.Array
    top_logprobs: jax.Array


def chain_children(num_nodes: int) -> np.ndarray:
    """`children i32[N, 1]` of a chain of N nodes (node v's child is v + 1)."""
    nxt = np.arange(1, num_nodes + 1, dtype=np.int32)
    nxt[-1] = -1
    return nxt[:, None]


def chain_parents(num_nodes: int) -> np.ndarray:
    """`parents i32[N]` of a chain of N nodes (-1 for the root)."""
    return np.arange(-1, num_nodes - 1, dtype=np.int32)


def path_nodes(parents: jax.Array, max_depth: int) -> jax.Array:
    """`bool[R, N, N]`: [r, v, u] = u lies on the path from the root to v, v included, the root excluded.
    `parents i32[R, N]`: -1 for the root, < -1 for padding nodes (empty path)."""
    num_nodes = parents.shape[1]
    on = (jnp.arange(num_nodes)[None, :, None] == jnp.arange(num_nodes)) & (parents[..., None] >= 0)
    direct = on
    for _ in range(max_depth - 1):
        of_parent = jnp.take_along_axis(on, jnp.clip(parents, 0)[..., None], axis=1)
        on = direct | (of_parent & (parents[..., None] >= 0))
    return on


def drafted_counts(pool: PenaltyPool, batch: SamplingBatch, tokens: jax.Array,
                   on_path: jax.Array) -> jax.Array:
    """Output counts per node `i32[R*N, V]`: the request's pool row (which counts the root's token, already
    output) plus the drafted tokens from the root to the node, the node's own included - the output the
    node's logits continue."""
    counts = jnp.take(pool.output_counts, batch.penalty_rows, axis=0, mode="clip")
    rows, num_nodes = tokens.shape
    node = jnp.broadcast_to(jnp.arange(rows * num_nodes).reshape(rows, num_nodes, 1), on_path.shape)
    tok = jnp.broadcast_to(tokens[:, None, :], on_path.shape)
    return counts.at[node.reshape(-1), tok.reshape(-1)].add(on_path.reshape(-1).astype(counts.dtype))


def target_probs(penalised: jax.Array, batch: SamplingBatch) -> jax.Array:
    """`f32[T, V]`: the distribution each row samples from, given its penalised logits (temperature and
    filters applied); greedy rows get one-hot(argmax)."""
    greedy = batch.temperatures == 0.0
    temperatures = jnp.where(greedy, 1.0, batch.temperatures)
    filtered = apply_filters(penalised / temperatures[:, None], batch.top_k, batch.top_p, batch.min_p)
    one_hot = jax.nn.one_hot(jnp.argmax(penalised, axis=-1), penalised.shape[-1], dtype=jnp.float32)
    return jnp.where(greedy[:, None], one_hot, jax.nn.softmax(filtered, axis=-1))


def verify_tree(logits: jax.Array, tokens: jax.Array, children: jax.Array, batch: SamplingBatch, *,
                max_depth: int, pool: PenaltyPool | None = None,
                parents: jax.Array | None = None, exact: jax.Array | None = None) -> Verdict:
    """Walk R draft trees of N nodes each.

    logits `[R*N, V]` (row-major: request r's node v at r*N + v), tokens `i32[R, N]` (node 0's is unused),
    children `i32[R, N, K]` (child indices in the order they are tried, -1 = none), batch: R*N sampling rows
    (node v of request r: the request's parameters, `num_generated = g + depth(v)`), `max_depth` (static):
    the deepest node's depth. With `pool`, penalties apply and need `parents i32[R, N]` (-1 root, < -1
    padding) to count the drafted tokens on each node's path. A batch without sampled rows takes a walk
    with no random draws (`lax.cond`; same verdict as the general walk gives greedy rows).

    `exact bool[R]` (optional): those requests are walked by matching instead of rejection sampling: at
    each node the token is the plain sampler's own draw (`sampler.draw_tokens`: the same masked logits,
    key and Gumbel-max draw), and a child is accepted iff it carries that token. Such a request emits
    exactly the tokens the plain engine samples with its seed; its acceptance is lower than rejection
    sampling's for sampled rows (a draft must equal the one drawn token), the same for greedy rows.
    """
    raw = logits.astype(jnp.float32)
    penalised = apply_logit_bias(raw, batch)
    if pool is not None:
        counts = drafted_counts(pool, batch, tokens, path_nodes(parents, max_depth))
        penalised = penalise(penalised, batch, counts, pool)
    penalised = apply_token_bitmask(penalised, batch.token_bitmask)
    logp = jax.nn.log_softmax(raw, axis=-1)
    walk = functools.partial(_walk, tokens=tokens, children=children, max_depth=max_depth, logp=logp)
    sampled = batch.temperatures > 0.0
    argmax = jnp.argmax(penalised, axis=-1).astype(jnp.int32)
    if exact is not None:
        exact_nodes = jnp.repeat(exact, tokens.shape[1])
        sampled = sampled & ~exact_nodes
        matched = walk(None, draw_tokens(penalised, batch))
    verdict = jax.lax.cond(jnp.any(sampled),
                           lambda: walk(target_probs(penalised, batch), row_keys(batch)),
                           lambda: walk(None, argmax))
    if exact is not None:
        verdict = jax.tree.map(lambda m, v: jnp.where(exact.reshape(-1, *[1] * (m.ndim - 1)), m, v),
                               matched, verdict)
    top_ids, top_lps = top_logprobs(logp, batch.num_top_logprobs)
    node = jnp.arange(tokens.shape[0])[:, None] * tokens.shape[1] + verdict.path
    return dataclasses.replace(verdict, top_ids=top_ids[node], top_logprobs=top_lps[node])


def _walk(probs, keys_or_argmax, *, tokens, children, max_depth: int, logp) -> Verdict:
    """The walk of `verify_tree`: with `probs` (f32[T, V]) and per-row keys, rejection sampling; with
    `probs=None` and the per-row argmax, greedy matching."""
    rows, num_nodes, branching = children.shape
    vocab = jnp.arange(logp.shape[-1])
    row = jnp.arange(rows)
    cur = jnp.zeros(rows, jnp.int32)
    live = jnp.ones(rows, bool)
    num_accepted = jnp.zeros(rows, jnp.int32)
    emitted, logprobs, path = [], [], []
    for depth in range(max_depth + 1):
        node = row * num_nodes + cur
        took, nxt = jnp.zeros(rows, bool), cur
        if probs is None:
            want = keys_or_argmax[node]
            for k in range(branching if depth < max_depth else 0):
                child = children[row, cur, k]
                ok = (child >= 0) & ~took & (tokens[row, jnp.maximum(child, 0)] == want)
                nxt, took = jnp.where(ok, child, nxt), took | ok
            out = want
        else:
            p, key = probs[node], keys_or_argmax[node]
            for k in range(branching if depth < max_depth else 0):
                child = children[row, cur, k]
                valid = (child >= 0) & ~took
                token = tokens[row, jnp.maximum(child, 0)]
                p_token = jnp.take_along_axis(p, token[:, None], axis=-1)[:, 0]
                u = jax.vmap(lambda kk, k=k: jax.random.uniform(jax.random.fold_in(kk, k)))(key)
                ok = valid & (u * p.sum(-1) < p_token)
                nxt, took = jnp.where(ok, child, nxt), took | ok
                p = jnp.where((valid & ~ok)[:, None] & (vocab[None, :] == token[:, None]), 0.0, p)
            gumbel = jax.vmap(lambda kk: jax.random.gumbel(jax.random.fold_in(kk, branching),
                                                           (logp.shape[-1],)))(key)
            drawn = jnp.argmax(jnp.where(p > 0, jnp.log(jnp.maximum(p, 1e-38)), -jnp.inf) + gumbel, axis=-1)
            out = jnp.where(took, tokens[row, nxt], drawn.astype(jnp.int32))
        emitted.append(out)
        logprobs.append(logp[node, out])
        path.append(cur)
        num_accepted = num_accepted + (live & took)
        live = live & took
        cur = nxt
    path = jnp.stack(path, 1)
    no_top = jnp.zeros((*path.shape, 0), jnp.int32)  # filled in by verify_tree, outside the cond
    return Verdict(num_accepted=num_accepted, emitted=jnp.stack(emitted, 1), logprobs=jnp.stack(logprobs, 1),
                   path=path, top_ids=no_top, top_logprobs=no_top.astype(jnp.float32))


def count_emitted(penalties: PenaltyPool, verdict: Verdict, penalty_rows: jax.Array):
    """Add a round's emitted tokens (j <= num_accepted) to the penalty pool rows `penalty_rows i32[R]`."""
    steps = verdict.emitted.shape[1]
    valid = jnp.arange(steps)[None, :] <= verdict.num_accepted[:, None]
    rows = jnp.where(valid, penalty_rows[:, None], NO_PENALTY_ROW)
    return update_counts(penalties, rows.reshape(-1), verdict.emitted.reshape(-1))
