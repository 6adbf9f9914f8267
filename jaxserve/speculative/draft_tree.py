"""Tree drafting (`speculative_eagle_topk` K > 1): a round is two jitted calls and two reads.

Drafting (one call, no host sync between steps): the frontier starts as the K best next tokens of the
draft's last step (depth 1, score = log-probability). Each of the S - 1 draft steps feeds the K frontier
tokens of every request at once (draft position n + s - 1 for depth s, scratch key indices
`n + (s-1)K .. n + sK - 1`, borrowed and returned by restoring the allocator's previous immutable state); a
node attends to the prefix, its ancestors' scratch keys and itself (a mask built on device from per-node
ancestor bits). Each node proposes its K best children (score = parent score + log-probability); the K best
of the K*K become the next frontier. Candidates: the K depth-1 nodes and the K*K children of every step.
The host reads the candidates (tokens, scores, parents) and selects the tree.

Verify (one call): the `num_draft_tokens - 1` best-scored candidates (parents score higher than children,
so the set is closed under parents; ties keep shallower nodes) plus the last known token `x` as the root,
at key indices n .. n+N-1, rope positions n + depth, each seeing the prefix, its ancestors and itself
(`AttentionMetadata.custom_mask`). In the same call: `rejection.verify_tree` walks the tree (greedy: the
child whose token is the target's argmax; sampled requests: exact rejection sampling over the children,
best-scored first; penalties count the drafted path), the accepted nodes' target KV is moved (`move_kv`,
all layers, both pool groups) to the consecutive slots n+1 .. n+a so that the request's KV stays a plain
sequence, and the draft extends over n .. n+a (a plain causal chain) to give the next round's state.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxserve.layers.attention_metadata import SequenceStep, build_attention_metadata, pick_bucket
from jaxserve.memory.kv_pool import move_kv
from jaxserve.sampling import SamplingParams, SamplingRow, build_sampling_batch
from jaxserve.speculative.draft_state import best_next, greedy_ids, store
from jaxserve.speculative.rejection import count_emitted, verify_tree

_PAD_PARAMS = SamplingParams(temperature=0.0)


@functools.lru_cache(maxsize=8)
def _make_tree_fns(tgraph, dgraph, num_steps: int, topk: int):
    scratch = (num_steps - 1) * topk

    @functools.partial(jax.jit, donate_argnames=("dpool",))
    def draft_tree(dparams, dpool, emb, states, state_rows, metas, prefix_lens):
        draft = nnx.merge(dgraph, dparams)
        top_ids, top_logp, hidden = (x[state_rows] for x in states)
        rows, k = top_ids.shape
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

    @functools.partial(jax.jit, donate_argnames=("pools", "dpool", "penalties", "states"))
    def verify_round(tparams, dparams, pools, dpool, penalties, states, emb, tokens, children, parents, meta,
                     ext_meta, sampling, dest):
        """Verify the trees, walk them, count the emitted tokens, move the accepted nodes' target KV to
        consecutive slots, draft-extend over them and store the next draft state: one call."""
        logits, pools, aux = nnx.merge(tgraph, tparams)(tokens.reshape(-1), meta, pools,
                                                        return_all_logits=True)
        verdict = verify_tree(logits, tokens, children, sampling, max_depth=num_steps, pool=penalties,
                              parents=parents)
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
        draft = nnx.merge(dgraph, dparams)
        ids, rows_in = _fit(verdict.emitted, nodes), _fit(src_row, nodes)
        dlogits, hidden, dpool = draft(ids.reshape(-1), aux[rows_in.reshape(-1)], ext_meta, dpool, emb,
                                       return_all_logits=True)
        last = jnp.arange(rows) * nodes + verdict.num_accepted
        states = store(states, dest, (*best_next(draft, dlogits[last], topk), hidden[last]))
        return pools, dpool, penalties, states, verdict, greedy_ids(draft, dlogits)

    return draft_tree, verify_round


def _fit(x: jax.Array, width: int) -> jax.Array:
    """`[R, D+1]` -> `[R, width]`: cut, or pad with the last column (never read: past the accepted span)."""
    if x.shape[1] >= width:
        return x[:, :width]
    return jnp.concatenate([x, jnp.broadcast_to(x[:, -1:], (x.shape[0], width - x.shape[1]))], axis=1)


def select_tree(tok, score, parent, num_nodes: int):
    """One request's candidates -> (tokens, parent verify index, depth) of the `num_nodes` verified nodes
    (index 0 is the root; a node's parent comes before it). Nodes whose parent was not selected are dropped
    (only possible on exact score ties)."""
    order = sorted(np.argsort(-score, kind="stable")[:num_nodes].tolist())
    index = {-1: 0}
    tokens, parents, depths = [-1], [-1], [0]
    for c in order:
        p = int(parent[c])
        if p not in index:
            continue
        index[c] = len(tokens)
        tokens.append(int(tok[c]))
        parents.append(index[p])
        depths.append(depths[index[p]] + 1)
    return tokens, parents, depths


class TreeDrafter:
    """The tree path of an `EagleWorker`."""

    def __init__(self, worker, tgraph, dgraph) -> None:
        self.w = worker
        self.k = worker.topk
        self._draft_tree, self._verify_round = _make_tree_fns(tgraph, dgraph, worker.num_steps, worker.topk)
        self.draft_tokens = tuple(b * self.k for b in worker.seq_buckets)

    @property
    def num_compiles(self) -> dict[str, int]:
        return {"draft_tree": self._draft_tree._cache_size(), "verify_tree": self._verify_round._cache_size()}

    def _draft(self, reqs, starts):
        w, kv, k, steps = self.w, self.w.kv, self.k, self.w.num_steps
        state_rows = w.state_rows(reqs)
        rows = state_rows.shape[0]
        if steps == 1:
            top_ids, top_logp = jax.device_get((w.states[0][state_rows], w.states[1][state_rows]))
            return top_ids, top_logp, np.full((rows, k), -1, np.int32)
        scratch = (steps - 1) * k
        backup = kv.allocator.state
        if not kv.extend_many([(r.cached, n, n + scratch) for r, n in zip(reqs, starts, strict=True)]):
            raise RuntimeError("tree draft scratch allocation failed after room was made (a bug)")
        pages = [kv.page_ids(r.cached, n + scratch)[0] for r, n in zip(reqs, starts, strict=True)]
        width = pick_bucket(max(p.shape[0] for p in pages), w.page_buckets, "pages_per_sequence")
        metas = [build_attention_metadata(
            [SequenceStep(k, n + s * k, p, positions=[n + s - 1] * k)
             for n, p in zip(starts, pages, strict=True)],
            page_size=kv.page_size, token_buckets=self.draft_tokens, seq_buckets=w.seq_buckets,
            page_buckets=(width,)) for s in range(1, steps)]
        stacked = jax.tree.map(lambda *xs: np.stack(xs), *metas)
        prefix = np.zeros(rows, np.int32)
        prefix[: len(starts)] = starts
        w.dpool, cands = self._draft_tree(w.dparams, w.dpool, w.emb, w.states, state_rows, stacked, prefix)
        cands = jax.device_get(cands)
        for req, n in zip(reqs, starts, strict=True):
            req.cached.kv_slots = req.cached.kv_slots[:n]
        kv.allocator.state = backup  # the scratch slots go back: nothing was freed since the backup
        return cands

    def round(self, reqs, starts):
        """Draft the trees (one call, candidates read back), select and verify them with everything after
        (one call, verdict read back). Per request (accepted drafts, new tokens, their logprobs, verify rows
        of the path), as `EagleWorker.results`."""
        w, kv, nv, k = self.w, self.w.kv, self.w.num_verify, self.k
        tok, score, parent = self._draft(reqs, starts)
        if not kv.extend_many([(r.cached, n, n + nv) for r, n in zip(reqs, starts, strict=True)]):
            raise RuntimeError("verify allocation failed after room was made (a bug)")
        num_rows = tok.shape[0]
        tokens = np.zeros((num_rows, nv), np.int32)
        parents = np.full((num_rows, nv), -2, np.int32)
        children = np.full((num_rows, nv, k), -1, np.int32)
        full_pages, swa_pages = kv.page_ids_many([r.cached for r in reqs], [n + nv for n in starts])
        depths, steps, chain, masks = [], [], [], []
        for i, (req, n) in enumerate(zip(reqs, starts, strict=True)):
            toks, pars, deps = select_tree(tok[i], score[i], parent[i], nv - 1)
            pad = nv - len(toks)  # dropped nodes: padding leaves that no walk reaches
            toks, pars, deps = toks + [0] * pad, pars + [-2] * pad, deps + [1] * pad
            toks[0] = req.output_ids[-1]
            tokens[i], parents[i] = toks, pars
            filled = np.zeros(nv, np.int32)
            for v in range(1, nv):  # children in index order = best-scored first among siblings
                if pars[v] >= 0:
                    children[i, pars[v], filled[pars[v]]] = v
                    filled[pars[v]] += 1
            depths.append(deps)
            swa = None if swa_pages is None else swa_pages[i]
            steps.append(SequenceStep(nv, n + nv, full_pages[i], swa, positions=[n + d for d in deps]))
            chain.append(SequenceStep(nv, n + nv, full_pages[i]))
            mask = np.zeros((nv, n + nv), bool)
            mask[:, :n] = True
            for v in range(nv):
                u = v
                while u >= 0:
                    mask[v, n + u] = True
                    u = pars[u] if pars[u] >= 0 else -1
            masks.append(mask)
        width = max(m.shape[1] for m in masks)
        custom = np.zeros((len(reqs) * nv, width), bool)
        for i, m in enumerate(masks):
            custom[i * nv:(i + 1) * nv, : m.shape[1]] = m
        buckets = dict(token_buckets=w.verify_tokens, seq_buckets=w.seq_buckets, page_buckets=w.page_buckets)
        meta = build_attention_metadata(steps, page_size=kv.page_size, with_swa=kv.hybrid, custom_mask=custom,
                                        **buckets)
        ext_meta = build_attention_metadata(chain, page_size=kv.page_size, **buckets)
        rows = w.sampling_rows(reqs, depths)
        rows += [SamplingRow(_PAD_PARAMS, 0, 0)] * (meta.num_tokens - len(rows))
        dest = np.full(num_rows, w.states[0].shape[0], np.int32)  # padding rows: dropped
        dest[: len(reqs)] = [w.state[r] for r in reqs]
        w.kv.pools, w.dpool, w.runner.penalties, w.states, verdict, top1 = self._verify_round(
            w.tparams, w.dparams, w.kv.pools, w.dpool, w.runner.penalties, w.states, w.emb, tokens, children,
            parents, meta, ext_meta, build_sampling_batch(rows, meta.num_tokens), dest)
        results = w.results(verdict, len(reqs))
        w.record_extend(ext_meta, top1, results)
        w.stats["tree_kv_moved"] += sum(int(r - i * nv != j) for i, (*_, vrows) in enumerate(results)
                                        for j, r in enumerate(vrows))
        return results
