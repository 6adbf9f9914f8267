"""Tree drafting (`speculative_eagle_topk` K > 1): the tree round's jitted programs. The host side (slots,
metadata, overlap) is the chain round's: `round_plan`, `shift`, `stepper`.

Drafting: the frontier starts as the K best next tokens of the draft's last step (depth 1, score =
log-probability). Each of the S - 1 draft steps feeds the K frontier tokens of every request at once (draft
position n + s - 1 for depth s, scratch key indices `n + (s-1)K .. n + sK - 1`, the request's own slots,
overwritten by the round's draft extend); a node attends to the prefix, its ancestors' scratch keys and
itself (a mask built on device from per-node ancestor bits). Each node proposes its K best children (score
= parent score + log-probability); the K best of the K*K become the next frontier. Candidates: the K
depth-1 nodes and the K*K children of every step.

Selection, on device (`select_tree`): the `num_draft_tokens - 1` best-scored candidates (parents score
higher than children, so the set is closed under parents; ties keep lower candidate indices) plus the last
known token `x` as the root, at key indices n .. n+N-1 in candidate order, rope positions n + depth, each
seeing the prefix, the root, its ancestors and itself (`tree_mask`, the metadata's custom mask).

Verify, in the same call: the target over the N nodes; `rejection.verify_tree` walks the tree (greedy: the
child whose token is the target's argmax; sampled requests: exact rejection sampling over the children,
best-scored first; penalties count the drafted path); the accepted nodes' target KV is moved (`move_kv`,
all layers, both pool groups) to the consecutive slots n+1 .. n+a so that the request's KV stays a plain
sequence; the draft extends over n .. n+a (a plain causal chain) to give the next round's state, and the
accepted count and last token are kept per state row so that a round dispatched before this one's verdict
is read continues from them on device (`shift.continue_round`: the overlapped schedule, as for chains).

Constrained rounds (a request in the batch has a grammar): two calls, `tree_draft` (drafting and selection)
and `tree_verify` (the rest), with the host between them: it reads the selected trees, walks each grammar
over its tree (`grammar_draft.walk_tree`: per-node masks, forced tokens substituted, nodes the grammar
refuses cut with their subtrees)
and verifies with those masks, constrained requests matching the plain sampler's draws (their output is
the plain engine's, greedy or seeded).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxserve.engine.program_cache import program_factory
from jaxserve.engine.runner import Programs
from jaxserve.engine.step_input import pad_meta, pad_sampling, pad_to
from jaxserve.memory.kv_pool import move_kv
from jaxserve.speculative.draft_state import extend_and_store, store
from jaxserve.speculative.rejection import count_emitted, path_nodes, verify_tree
from jaxserve.speculative.shift import continue_round


def draft_candidates(draft, dpool, emb, top_ids, top_logp, hidden, metas, prefix_lens, *, num_steps: int):
    """The S - 1 tree draft steps (module docstring). Returns the draft pool and the candidates
    `(tokens, scores, parents)`, each `[R, C]` with C = K + (S-1)K^2 (parent: candidate index, -1 = root)."""
    rows, k = top_ids.shape
    scratch = (num_steps - 1) * k
    tokens, scores = top_ids, top_logp
    anc = jnp.zeros((rows, k, scratch), bool)
    hid = jnp.broadcast_to(hidden[:, None, :], (rows, k, hidden.shape[-1]))
    cand_tok, cand_score, cand_parent = [top_ids], [top_logp], [jnp.full((rows, k), -1, jnp.int32)]
    frontier = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), (rows, k))
    offset = k
    for s in range(1, num_steps):
        meta = jax.tree.map(lambda x, s=s: x[s - 1], metas)
        rel = jnp.arange(meta.max_kv_len)[None, None, :] - prefix_lens[:, None, None]
        in_scratch = (rel >= 0) & (rel < scratch)
        seen = jnp.take_along_axis(anc, jnp.broadcast_to(jnp.clip(rel, 0, scratch - 1),
                                                         (rows, k, meta.max_kv_len)), axis=-1)
        own = rel == ((s - 1) * k + jnp.arange(k))[None, :, None]
        mask = (rel < 0) | (in_scratch & seen) | own
        meta = dataclasses.replace(meta, custom_mask=mask.reshape(rows * k, -1))
        logits, out, dpool = draft(tokens.reshape(-1), hid.reshape(rows * k, -1), meta, dpool, emb,
                                   return_all_logits=True)
        logp, ids = jax.lax.top_k(jax.nn.log_softmax(logits, axis=-1), k)
        child_tok = draft.to_target_ids(ids.astype(jnp.int32)).reshape(rows, k * k)
        child_score = (scores[:, :, None] + logp.reshape(rows, k, k)).reshape(rows, k * k)
        cand_tok.append(child_tok)
        cand_score.append(child_score)
        cand_parent.append(jnp.repeat(frontier, k, axis=1))
        scores, pick = jax.lax.top_k(child_score, k)
        parent = pick // k
        tokens = jnp.take_along_axis(child_tok, pick, axis=1)
        hid = jnp.take_along_axis(out.reshape(rows, k, -1), parent[..., None], axis=1)
        own_bit = jax.nn.one_hot((s - 1) * k + parent, scratch, dtype=bool)
        anc = jnp.take_along_axis(anc, parent[..., None], axis=1) | own_bit
        frontier = (offset + pick).astype(jnp.int32)
        offset += k * k
    return dpool, (jnp.concatenate(cand_tok, 1), jnp.concatenate(cand_score, 1),
                   jnp.concatenate(cand_parent, 1))


def candidate_depths(num_steps: int, topk: int) -> np.ndarray:
    """Depth of each candidate: K at depth 1, then K*K per draft step."""
    return np.concatenate([np.full(topk if s == 0 else topk * topk, s + 1, np.int32)
                           for s in range(num_steps)])


def select_tree(cand_tok, cand_score, cand_parent, last, *, num_nodes: int, num_steps: int, topk: int):
    """Candidates `[R, C]` -> the verified trees: tokens `i32[R, N]` (node 0 = the root, token `last`),
    parents `i32[R, N]` (-1 root, -2 padding), depths `i32[R, N]`, children `i32[R, N, K]` (index order,
    which among siblings is best score first; -1 none). The N - 1 best-scored candidates (ties: lower index
    first), in candidate order, so a parent precedes its children (parents score higher: the set is closed
    under parents); a node whose parent was not selected (only on exact ties) is padding, as are its
    descendants."""
    rows, num_cands = cand_tok.shape
    _, sel = jax.lax.top_k(cand_score, num_nodes - 1)
    sel = jnp.sort(sel, axis=1)
    r = jnp.arange(rows)[:, None]
    inv = jnp.full((rows, num_cands), -1, jnp.int32).at[r, sel].set(
        jnp.arange(1, num_nodes, dtype=jnp.int32)[None, :])
    pc = jnp.take_along_axis(cand_parent, sel, axis=1)
    pv = jnp.where(pc < 0, 0, jnp.take_along_axis(inv, jnp.maximum(pc, 0), axis=1))
    parents = jnp.concatenate([jnp.full((rows, 1), -1, jnp.int32), pv], axis=1)
    is_root = jnp.arange(num_nodes)[None, :] == 0
    ok = (parents >= 0) | is_root
    for _ in range(num_steps):
        ok = ok & (jnp.take_along_axis(ok, jnp.maximum(parents, 0), axis=1) | is_root)
    parents = jnp.where(ok, parents, -2)
    tokens = jnp.concatenate([last[:, None], jnp.take_along_axis(cand_tok, sel, axis=1)], axis=1)
    tokens = jnp.where(ok, tokens, 0)
    depth_of = jnp.asarray(candidate_depths(num_steps, topk))
    depths = jnp.concatenate([jnp.zeros((rows, 1), jnp.int32), depth_of[sel]], axis=1)
    depths = jnp.where(ok, depths, 1)
    node = jnp.arange(num_nodes)
    earlier = (parents[:, :, None] == parents[:, None, :]) & (node[None, None, :] < node[None, :, None])
    rank = earlier.sum(-1).astype(jnp.int32)
    slot = jnp.where(parents >= 0, parents, num_nodes)  # out of range: dropped
    children = jnp.full((rows, num_nodes, topk), -1, jnp.int32).at[r, slot, rank].set(
        jnp.broadcast_to(node.astype(jnp.int32), (rows, num_nodes)), mode="drop")
    return tokens, parents, depths, children


def tree_mask(parents, prefix_lens, max_kv_len: int, num_steps: int):
    """`bool[R*N, max_kv_len]`: node v sees the prefix (key indices < n), the root, its path and itself."""
    rows, num_nodes = parents.shape
    node = jnp.arange(num_nodes)
    own = node[None, :, None] == node[None, None, :]
    vis = path_nodes(parents, num_steps) | (node[None, None, :] == 0) | own
    rel = jnp.arange(max_kv_len)[None, None, :] - prefix_lens[:, None, None]
    look = jnp.take_along_axis(vis, jnp.broadcast_to(jnp.clip(rel, 0, num_nodes - 1),
                                                     (rows, num_nodes, max_kv_len)), axis=2)
    return ((rel < 0) | ((rel < num_nodes) & look)).reshape(rows * num_nodes, max_kv_len)


def _prefix_lens(meta, num_nodes: int):
    """Per sequence, the key index of the root (the verify's first key; 0 for padding rows)."""
    return jnp.maximum(meta.kv_lens - num_nodes, 0)


@program_factory(maxsize=16)
def make_tree_programs(tgraph, dgraph, num_steps: int, topk: int, num_nodes: int,
                       record: bool) -> tuple[Programs, Programs, Programs]:
    """The tree round's programs for one (target, draft) graph pair: `tree_round` (arguments and results as
    the chain round's, see `round_plan.RoundPlan.inputs`), and a constrained round's two halves
    `tree_draft` and `tree_verify`. `record`: the draft extend also returns its top-1 at every position."""
    advance = min(num_steps, num_nodes - 1) + 1  # the most a round moves a request (`round_plan`)

    def tree_draft(dparams, dpool, states, emb, state_rows, last, draft_metas, prefix_lens):
        """Draft and select the trees: (draft pool, tokens, parents, depths, children) as `select_tree`."""
        draft = nnx.merge(dgraph, dparams)
        top_ids, top_logp, hidden = (x[state_rows] for x in states)
        if num_steps > 1:
            dpool, cands = draft_candidates(draft, dpool, emb, top_ids, top_logp, hidden, draft_metas,
                                            prefix_lens, num_steps=num_steps)
        else:
            cands = (top_ids, top_logp, jnp.full(top_ids.shape, -1, jnp.int32))
        return dpool, *select_tree(*cands, last, num_nodes=num_nodes, num_steps=num_steps, topk=topk)

    def tree_verify(tparams, dparams, pools, dpool, penalties, states, shifts, emb, dest, tokens, parents,
                    depths, children, exact, meta, sampling):
        """Verify the selected trees (`exact`: rows walked by matching the plain sampler's draws, see
        `rejection.verify_tree`; None: none), walk, count the emitted tokens, move the accepted nodes'
        target KV to consecutive slots, draft-extend over them, store the next draft state and, per state
        row, the accepted drafts and last emitted token (`shifts`, read by an overlapped next round)."""
        draft = nnx.merge(dgraph, dparams)
        prefix_lens = _prefix_lens(meta, num_nodes)
        ext_meta = meta  # the verify span as a plain chain: where the draft extend writes
        meta = dataclasses.replace(
            meta, positions=(prefix_lens[:, None] + depths).reshape(-1),
            custom_mask=tree_mask(parents, prefix_lens, meta.max_kv_len, num_steps))
        sampling = dataclasses.replace(sampling, num_generated=sampling.num_generated + depths.reshape(-1))
        logits, pools, aux = nnx.merge(tgraph, tparams)(tokens.reshape(-1), meta, pools,
                                                        return_all_logits=True)
        verdict = verify_tree(logits, tokens, children, sampling, max_depth=num_steps, pool=penalties,
                              parents=parents, exact=exact)
        rows, nodes = tokens.shape
        penalties = count_emitted(penalties, verdict, sampling.penalty_rows.reshape(rows, nodes)[:, 0])
        # accepted node path[j] (verify key index n + path[j]) moves to n + j; the rest are dropped writes
        base = (jnp.arange(rows) * nodes)[:, None]
        src_row, dst_row = base + verdict.path, base + jnp.arange(num_steps + 1)[None, :]
        steps = jnp.arange(num_steps + 1)[None, :]
        moving = (steps <= verdict.num_accepted[:, None]) & (verdict.path != steps)

        def moved(pool, write_slots):
            dst = jnp.where(moving, write_slots[dst_row], pool.data.shape[1]).reshape(-1)  # out of range
            return move_kv(pool, write_slots[src_row].reshape(-1), dst)

        if meta.swa_write_slots is None:
            pools = moved(pools, meta.write_slots)
        else:
            pools = pools.replace(full=moved(pools.full, meta.write_slots),
                                  swa=moved(pools.swa, meta.swa_write_slots))
        # draft extend over positions n .. n+N-1 (a plain chain, `ext_meta`): position n + j takes the j-th
        # emitted token and the captured state of the node that produced it; exact up to n + a (a < N)
        ids, rows_in = _fit(verdict.emitted, nodes), _fit(src_row, nodes)
        dpool, states, top1 = extend_and_store(
            draft, ids.reshape(-1), aux[rows_in.reshape(-1)], ext_meta, dpool, emb, states, dest,
            jnp.arange(rows) * nodes + verdict.num_accepted, topk=topk, record=record)
        last_tok = jnp.take_along_axis(verdict.emitted, verdict.num_accepted[:, None], axis=1)[:, 0]
        shifts = store(shifts, dest, (verdict.num_accepted, last_tok))
        return pools, dpool, penalties, states, shifts, verdict, top1

    @functools.partial(jax.jit, donate_argnames=("pools", "dpool", "penalties", "states", "shifts"))
    def tree_round(tparams, dparams, pools, dpool, penalties, states, shifts, emb, state_rows, dest, shifted,
                   last, draft_metas, meta, sampling):
        """`tree_draft` then `tree_verify`: one call, no host sync. Sequences flagged `shifted` continue the
        previous round on device (`shift.continue_round`)."""
        last, draft_metas, meta, sampling = continue_round(shifts, state_rows, shifted, last, draft_metas,
                                                           meta, sampling, advance=advance)
        dpool, tokens, parents, depths, children = tree_draft(dparams, dpool, states, emb, state_rows, last,
                                                              draft_metas, _prefix_lens(meta, num_nodes))
        return tree_verify(tparams, dparams, pools, dpool, penalties, states, shifts, emb, dest, tokens,
                           parents, depths, children, None, meta, sampling)

    # fixed arguments: target params, draft params, embedding table (see `Programs`)
    donated = ("pools", "dpool", "penalties", "states", "shifts")
    return (Programs(tree_round, "tree_round", fixed=(0, 1, 7)),
            Programs(jax.jit(tree_draft, donate_argnames=("dpool",)), "tree_draft", fixed=(0, 3)),
            Programs(jax.jit(tree_verify, donate_argnames=donated), "tree_verify", fixed=(0, 1, 7)))


def _fit(x: jax.Array, width: int) -> jax.Array:
    """`[R, D+1]` -> `[R, width]`: cut, or pad with the last column (never read: past the accepted span)."""
    if x.shape[1] >= width:
        return x[:, :width]
    return jnp.concatenate([x, jnp.broadcast_to(x[:, -1:], (x.shape[0], width - x.shape[1]))], axis=1)


def repad_tree_draft(args: tuple, bucket: tuple[int, int]) -> tuple:
    """`tree_draft`'s arguments padded to the bucket (seqs, pages): padding rows read state row 0, root
    token 0, prefix 0."""
    s, p = bucket
    state_rows, last, draft_metas, prefix_lens = args[4:]
    if draft_metas is not None:
        width = draft_metas.positions.shape[-1] // state_rows.shape[0]
        draft_metas = pad_meta(draft_metas, s * width, s, p)
    return (*args[:4], pad_to(state_rows, (s,)), pad_to(last, (s,)), draft_metas, pad_to(prefix_lens, (s,)))


def repad_tree_verify(args: tuple, bucket: tuple[int, int]) -> tuple:
    """`tree_verify`'s arguments padded to the bucket (seqs, pages): padding rows store nothing
    (out-of-range row) and verify a lone greedy root (its other nodes padding), not matched exactly."""
    s, p = bucket
    states, (dest, tokens, parents, depths, children, exact, meta, sampling) = args[5], args[8:]
    nodes = tokens.shape[1]
    lone = np.full(nodes, -2, np.int32)
    lone[0] = -1
    parents = np.concatenate([np.asarray(parents), np.broadcast_to(lone, (s - parents.shape[0], nodes))])
    return (*args[:8], pad_to(dest, (s,), states[0].shape[0]), pad_to(tokens, (s, None)), parents,
            pad_to(depths, (s, None), 1), pad_to(children, (s, None, None), -1), pad_to(exact, (s,), False),
            pad_meta(meta, s * nodes, s, p), pad_sampling(sampling, s * nodes))
