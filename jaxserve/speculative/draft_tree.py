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
(`AttentionMetadata.custom_mask`). Accept: from the root, follow the child whose token is the target's
argmax at the current node; the argmax where no child matches is the extra token. The accepted nodes' target
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


@functools.lru_cache(maxsize=8)
def _make_tree_fns(tgraph, dgraph, num_steps: int, topk: int):
    scratch = (num_steps - 1) * topk

    @functools.partial(jax.jit, donate_argnames=("dpool",))
    def draft_tree(dparams, dpool, emb, top_ids, top_logp, hidden, metas, prefix_lens):
        draft = nnx.merge(dgraph, dparams)
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

    @functools.partial(jax.jit, donate_argnames=("pools",))
    def verify_tree(tparams, pools, input_ids, meta):
        logits, pools, aux = nnx.merge(tgraph, tparams)(input_ids, meta, pools, return_all_logits=True)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        return pools, jnp.argmax(logits, -1).astype(jnp.int32), logp.max(-1), aux

    @functools.partial(jax.jit, donate_argnames=("pools",))
    def compact(pools, src, dst, swa_src, swa_dst):
        if swa_src is None:
            return move_kv(pools, src, dst)
        return pools.replace(full=move_kv(pools.full, src, dst), swa=move_kv(pools.swa, swa_src, swa_dst))

    return draft_tree, verify_tree, compact


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
    """The tree path of an `EagleWorker` (greedy requests only)."""

    def __init__(self, worker, tgraph, dgraph) -> None:
        self.w = worker
        self.k = worker.topk
        self._draft_tree, self._verify_tree, self._compact = _make_tree_fns(tgraph, dgraph, worker.num_steps,
                                                                            worker.topk)
        self.draft_tokens = tuple(b * self.k for b in worker.seq_buckets)

    def _draft(self, reqs, starts):
        w, kv, k, steps = self.w, self.w.kv, self.k, self.w.num_steps
        rows = pick_bucket(len(reqs), w.seq_buckets, "num_seqs")
        hidden0 = w.state[reqs[0]][2]
        top_ids = np.zeros((rows, k), np.int32)
        top_logp = np.full((rows, k), -1e9, np.float32)
        hidden = np.zeros((rows, hidden0.shape[0]), hidden0.dtype)
        for i, req in enumerate(reqs):
            top_ids[i], top_logp[i], hidden[i] = w.state[req]
        if steps == 1:
            empty = np.full((rows, k), -1, np.int32)
            return top_ids, top_logp, empty
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
        w.dpool, cands = self._draft_tree(w.dparams, w.dpool, w.emb, top_ids, top_logp, hidden, stacked,
                                          prefix)
        cands = tuple(np.asarray(c) for c in cands)
        for req, n in zip(reqs, starts, strict=True):
            req.cached.kv_slots = req.cached.kv_slots[:n]
        kv.allocator.state = backup
        return cands

    def draft_and_verify(self, reqs, starts):
        w, kv, nv = self.w, self.w.kv, self.w.num_verify
        tok, score, parent = self._draft(reqs, starts)
        if not kv.extend_many([(r.cached, n, n + nv) for r, n in zip(reqs, starts, strict=True)]):
            raise RuntimeError("verify allocation failed after room was made (a bug)")
        trees, steps, masks, ids = [], [], [], []
        for i, (req, n) in enumerate(zip(reqs, starts, strict=True)):
            tokens, parents, depths = select_tree(tok[i], score[i], parent[i], nv - 1)
            pad = nv - len(tokens)  # dropped nodes: padding leaves that match nothing
            tokens, parents, depths = tokens + [0] * pad, parents + [-2] * pad, depths + [1] * pad
            tokens[0] = req.output_ids[-1]
            trees.append((tokens, parents))
            full, swa = kv.page_ids(req.cached, n + nv)
            steps.append(SequenceStep(nv, n + nv, full, swa, positions=[n + d for d in depths]))
            mask = np.zeros((nv, n + nv), bool)
            mask[:, :n] = True
            for v in range(nv):
                u = v
                while u >= 0:
                    mask[v, n + u] = True
                    u = parents[u] if parents[u] >= 0 else -1
            masks.append(mask)
            ids += tokens
        width = max(m.shape[1] for m in masks)
        custom = np.zeros((len(ids), width), bool)
        for i, m in enumerate(masks):
            custom[i * nv:(i + 1) * nv, : m.shape[1]] = m
        meta = build_attention_metadata(steps, page_size=kv.page_size, with_swa=kv.hybrid, custom_mask=custom,
                                        token_buckets=w.verify_tokens, seq_buckets=w.seq_buckets,
                                        page_buckets=w.page_buckets)
        input_ids = np.zeros(meta.num_tokens, np.int32)
        input_ids[: len(ids)] = ids
        w.kv.pools, target, logp, aux = self._verify_tree(w.tparams, w.kv.pools, input_ids, meta)
        target, logp = np.asarray(target), np.asarray(logp)
        results, src, dst = [], [], []
        for i, ((tokens, parents), req, n) in enumerate(zip(trees, reqs, starts, strict=True)):
            path, cur = [0], 0
            while True:
                want = int(target[i * nv + cur])
                child = next((c for c in range(1, nv) if parents[c] == cur and tokens[c] == want), None)
                if child is None:
                    break
                path.append(child)
                cur = child
            new = [int(target[i * nv + v]) for v in path]
            logps = [float(logp[i * nv + v]) for v in path]
            slots = req.cached.kv_slots
            for j, v in enumerate(path):
                if v != j:
                    src.append(int(slots[n + v]))
                    dst.append(int(slots[n + j]))
            results.append((len(path) - 1, new, logps, [i * nv + v for v in path]))
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
