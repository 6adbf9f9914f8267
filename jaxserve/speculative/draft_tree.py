"""Tree drafting (`speculative_eagle_topk` K > 1) with greedy verification through a tree attention mask.

Drafting (one jitted function, no host sync between steps): the frontier starts as the K best next tokens
of the draft's last step (depth 1, score = log-probability). Each of the S - 1 draft steps feeds the K
frontier tokens of every request at once (draft position n + s - 1 for depth s, scratch key indices
`n + (s-1)K .. n + sK - 1`, borrowed and returned by restoring the allocator state); a node attends to the
prefix, its ancestors' scratch keys and itself (a mask built on device from per-node ancestor bits). Each
node proposes its K best children (score = parent score + log-probability); the K best of the K*K become
the next frontier. Candidates: the K depth-1 nodes and the K*K children of every step.

Verify: the `num_draft_tokens - 1` best-scored candidates (parents score higher than children, so the set
is closed under parents; ties keep shallower nodes) plus the last known token `x` as the root, at key
indices n .. n+N-1, rope positions n + depth, each seeing the prefix, its ancestors and itself
(`AttentionMetadata.custom_mask`). Accept: `rejection.verify_tree` walks the tree from the root (greedy:
the child whose token is the target's argmax; sampled requests: exact rejection sampling over the children,
best-scored first), in the same jitted call as the verify. The accepted nodes' target
KV is then moved (`move_kv`, all layers, both pool groups) to the consecutive slots n+1 .. n+a, so the
request's KV stays a plain sequence; the draft extend rewrites the draft KV there.
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

    @functools.partial(jax.jit, donate_argnames=("pools", "penalties"))
    def verify_round(tparams, pools, penalties, tokens, children, parents, meta, sampling):
        logits, pools, aux = nnx.merge(tgraph, tparams)(tokens.reshape(-1), meta, pools,
                                                        return_all_logits=True)
        verdict = verify_tree(logits, tokens, children, sampling, max_depth=num_steps, pool=penalties,
                              parents=parents)
        rows, nodes = tokens.shape
        penalties = count_emitted(penalties, verdict, sampling.penalty_rows.reshape(rows, nodes)[:, 0])
        return pools, penalties, verdict, aux

    @functools.partial(jax.jit, donate_argnames=("pools",))
    def compact(pools, src, dst, swa_src, swa_dst):
        if swa_src is None:
            return move_kv(pools, src, dst)
        return pools.replace(full=move_kv(pools.full, src, dst), swa=move_kv(pools.swa, swa_src, swa_dst))

    return draft_tree, verify_round, compact


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
        self._draft_tree, self._verify_round, self._compact = _make_tree_fns(tgraph, dgraph,
                                                                             worker.num_steps, worker.topk)
        self.draft_tokens = tuple(b * self.k for b in worker.seq_buckets)

    @property
    def num_compiles(self) -> dict[str, int]:
        return {"draft_tree": self._draft_tree._cache_size(), "verify_tree": self._verify_round._cache_size(),
                "compact": self._compact._cache_size()}

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

    def draft_and_verify(self, reqs, starts):
        w, kv, nv, k = self.w, self.w.kv, self.w.num_verify, self.k
        tok, score, parent = self._draft(reqs, starts)
        if not kv.extend_many([(r.cached, n, n + nv) for r, n in zip(reqs, starts, strict=True)]):
            raise RuntimeError("verify allocation failed after room was made (a bug)")
        num_rows = tok.shape[0]
        tokens = np.zeros((num_rows, nv), np.int32)
        parents = np.full((num_rows, nv), -2, np.int32)
        children = np.full((num_rows, nv, k), -1, np.int32)
        depths, steps, masks = [], [], []
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
            full, swa = kv.page_ids(req.cached, n + nv)
            steps.append(SequenceStep(nv, n + nv, full, swa, positions=[n + d for d in deps]))
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
        meta = build_attention_metadata(steps, page_size=kv.page_size, with_swa=kv.hybrid, custom_mask=custom,
                                        token_buckets=w.verify_tokens, seq_buckets=w.seq_buckets,
                                        page_buckets=w.page_buckets)
        rows = w.sampling_rows(reqs, depths)
        rows += [SamplingRow(_PAD_PARAMS, 0, 0)] * (meta.num_tokens - len(rows))
        w.kv.pools, w.runner.penalties, verdict, aux = self._verify_round(
            w.tparams, w.kv.pools, w.runner.penalties, tokens, children, parents, meta,
            build_sampling_batch(rows, meta.num_tokens))
        results = w.results(verdict, len(reqs))
        src, dst = [], []
        for i, ((_, _, _, vrows), req, n) in enumerate(zip(results, reqs, starts, strict=True)):
            slots = req.cached.kv_slots
            for j, r in enumerate(vrows):
                v = r - i * nv
                if v != j:
                    src.append(int(slots[n + v]))
                    dst.append(int(slots[n + j]))
        if src:
            self._move(src, dst)
            w.stats["tree_kv_moved"] += len(src)
        return results, aux

    def _move(self, src, dst):
        kv = self.w.kv
        size = pick_bucket(len(src), self.w.verify_tokens, "moved tokens")
        s = np.zeros(size, np.int64)
        d = np.zeros(size, np.int64)
        s[: len(src)], d[: len(dst)] = src, dst
        if kv.hybrid:
            ss, sd = np.zeros(size, np.int64), np.zeros(size, np.int64)
            ss[: len(src)] = kv.allocator.swa_slots_of(np.asarray(src))
            sd[: len(dst)] = kv.allocator.swa_slots_of(np.asarray(dst))
            self.w.kv.pools = self._compact(kv.pools, s, d, ss, sd)
        else:
            self.w.kv.pools = self._compact(kv.pools, s, d, None, None)
