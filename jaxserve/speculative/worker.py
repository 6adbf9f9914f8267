"""`EagleWorker`: EAGLE-3 speculative decoding inside the engine (chain drafting, greedy verification).

State of a decoding request with `n = num_computed` (facts: reference eagle3-gptoss.md section 3): target
KV and draft KV at positions `[0, n)`, the last token `x` (position n) known but not computed, and from the
draft's last step the proposal `d1` for position n + 1 with the draft hidden state that produced it.

Prefill step: the target runs the chunk (writing its KV, capturing `aux` hidden states, sampling at the end of
the prompt), then the draft runs over the same positions and slots with the input ids shifted left by one -
position i gets token i + 1, the last one the token just sampled - in the same jitted call. This shift is why
the prefix tree keys bigrams (`KVCache(eagle=True)`): the draft KV at i is valid only next to token i + 1.

Decode round (one per step, for every decoding request):
1. draft: back up the allocator state, take scratch slots for positions n .. n+S-2, run the S-1 draft steps
   in one jitted function (a Python loop unrolled under jit: no host sync between steps), then restore the
   state (O(1), no per-slot frees). With the proposal from the previous round that makes S draft tokens.
2. verify: take slots for positions n .. n+S, run the target over `[x, d1 .. dS]` (causal: a chain), compare
   its greedy tokens with the drafts; the longest matching prefix (a tokens) plus the target's own next token
   are accepted. Slots of whole pages past the new end n + a + 1 are freed.
3. draft extend over the accepted positions n .. n+a with the now known next tokens (the accepted ones),
   reading the verify's captured states: it rewrites the draft KV there and gives the next `d1`.
Requests that finish in the round still get step 3 before `cache_finished_req`, so that every position the
tree caches has draft KV computed with its true next token.

Memory: room for the verify slots is made (evicting, then retracting the newest request) before the backup,
so nothing is freed between backup and restore. Compiled shapes: prefill per (tokens, seqs, pages) bucket;
draft chain, verify and draft extend per (seqs, pages) bucket (the verify and extend token counts are padded
to seqs * (S + 1)).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxserve.engine.errors import SchedulerStuckError
from jaxserve.engine.kv_cache import KVCache
from jaxserve.engine.request import Request, Status
from jaxserve.engine.step_input import Buckets, ScheduledSeq, build_step_input
from jaxserve.layers.attention_metadata import SequenceStep, build_attention_metadata, pick_bucket
from jaxserve.models.decoder import CausalLM
from jaxserve.sampling import SamplingParams, SamplingRow, build_sampling_batch, sample
from jaxserve.speculative.eagle3_draft import Eagle3Draft, make_draft_pool
from jaxserve.speculative.rejection import verify_tokens
from jaxserve.speculative.schedule import SpecScheduler

_PAD_PARAMS = SamplingParams(temperature=0.0)


@functools.lru_cache(maxsize=8)
def _make_fns(tgraph, dgraph, num_steps: int, topk: int = 1):
    """The four jitted pieces for one (target, draft) graph pair, chain length and branching (prefill and
    draft extend hand back the draft's `topk` best next tokens with their log-probabilities)."""

    def target_of(params):
        return nnx.merge(tgraph, params)

    def draft_of(params):
        return nnx.merge(dgraph, params)

    def greedy(draft: Eagle3Draft, logits):
        return draft.to_target_ids(jnp.argmax(logits, axis=-1).astype(jnp.int32))

    def best(draft: Eagle3Draft, logits):
        logp, ids = jax.lax.top_k(jax.nn.log_softmax(logits, axis=-1), topk)
        return draft.to_target_ids(ids.astype(jnp.int32)), logp

    @functools.partial(jax.jit, donate_argnames=("pools", "dpool"))
    def prefill(tparams, dparams, pools, dpool, emb, input_ids, next_ids, from_sample, meta, sampling):
        logits, pools, aux = target_of(tparams)(input_ids, meta, pools)
        out = sample(logits, sampling, None)
        ids = jnp.where(from_sample >= 0, out.token_ids[jnp.maximum(from_sample, 0)], next_ids)
        draft = draft_of(dparams)
        dlogits, hidden, dpool = draft(ids, aux, meta, dpool, emb, return_all_logits=True)
        top1 = greedy(draft, dlogits)
        return pools, dpool, out, best(draft, dlogits[meta.sample_idx]), hidden[meta.sample_idx], top1

    @functools.partial(jax.jit, donate_argnames=("dpool",))
    def draft_chain(dparams, dpool, emb, first, hidden, metas):
        draft = draft_of(dparams)
        ids, tokens = first, [first]
        for k in range(num_steps - 1):
            meta = jax.tree.map(lambda x, k=k: x[k], metas)
            logits, out, dpool = draft(ids, hidden, meta, dpool, emb)
            hidden = out[meta.sample_idx]
            ids = greedy(draft, logits)
            tokens.append(ids)
        return dpool, jnp.stack(tokens, axis=1)

    @functools.partial(jax.jit, donate_argnames=("pools",))
    def verify(tparams, pools, last, drafts, meta, sampling):
        rows, num_drafts = drafts.shape
        input_ids = jnp.concatenate([last[:, None], drafts], axis=1).reshape(-1)
        logits, pools, aux = target_of(tparams)(input_ids, meta, pools, return_all_logits=True)
        # the draft proposed at each verified position (none after the last one)
        proposed = jnp.concatenate([drafts, jnp.full((rows, 1), -1, jnp.int32)], axis=1).reshape(-1)
        accept, correction = verify_tokens(logits.astype(jnp.float32), proposed, sampling)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        logp_prop = jnp.take_along_axis(logp, jnp.maximum(proposed, 0)[:, None], axis=-1)[:, 0]
        logp_corr = jnp.take_along_axis(logp, correction[:, None], axis=-1)[:, 0]
        shape = (rows, num_drafts + 1)
        return pools, accept.reshape(shape), correction.reshape(shape), logp_prop.reshape(shape), \
            logp_corr.reshape(shape), drafts, aux

    @functools.partial(jax.jit, donate_argnames=("dpool",))
    def draft_extend(dparams, dpool, emb, ids, aux, rows, meta):
        draft = draft_of(dparams)
        logits, hidden, dpool = draft(ids, aux[rows], meta, dpool, emb, return_all_logits=True)
        top1 = greedy(draft, logits)
        return dpool, best(draft, logits[meta.sample_idx]), hidden[meta.sample_idx], top1

    return prefill, draft_chain, verify, draft_extend


class EagleWorker:
    """Runs speculative steps for an engine: owns the draft, its KV pool and the per-request draft state."""

    def __init__(self, target: CausalLM, draft: Eagle3Draft, kv: KVCache, scheduler: SpecScheduler,
                 buckets: Buckets, *, num_steps: int, context_length: int, topk: int = 1,
                 num_draft_tokens: int | None = None) -> None:
        if tuple(target.aux_hidden_state_layer_ids) != tuple(draft.config.aux_layer_ids):
            raise ValueError(f"the target captures layers {target.aux_hidden_state_layer_ids} but the draft "
                             f"reads {draft.config.aux_layer_ids}: load the target with "
                             f"aux_hidden_state_layer_ids={tuple(draft.config.aux_layer_ids)}")
        tgraph, self.tparams = nnx.split(target)
        dgraph, self.dparams = nnx.split(draft)
        self.kv, self.scheduler, self.buckets = kv, scheduler, buckets
        self.num_steps = num_steps
        self.topk = topk
        self.num_verify = num_steps + 1 if topk == 1 else num_draft_tokens
        # slots a round needs past the last computed position: the verify span, or the tree's draft scratch
        self.num_reserve = max(self.num_verify, (num_steps - 1) * topk)
        self.emb = target.embed.embed.embedding[...]
        self.dpool = make_draft_pool(draft.config, kv.num_pages, kv.page_size, draft.config.jnp_dtype)
        self._prefill, self._draft_chain, self._verify, self._draft_extend = _make_fns(tgraph, dgraph,
                                                                                       num_steps, topk)
        self.seq_buckets = tuple(buckets.seqs)
        self.verify_tokens = tuple(b * self.num_verify for b in self.seq_buckets)
        most_pages = min(kv.pages_for(context_length + self.num_reserve), kv.num_pages)
        self.page_buckets = tuple(sorted({*buckets.pages, max(most_pages, max(buckets.pages))}))
        # per decoding request: the draft's best next tokens, their log-probabilities, its hidden state
        self.state: dict[Request, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        scheduler.has_state = self.state.__contains__
        scheduler.on_retract = self.forget
        # diagnostics (off by default): slot -> the draft's top-1 (target id) computed with the draft KV
        # the slot holds, i.e. its prediction for the token two positions on; -1 = never written
        self.slot_top1: np.ndarray | None = None
        self.stats = {"prefill_steps": 0, "rounds": 0, "verified": 0, "accepted": 0, "tree_kv_moved": 0}
        self.tree = None
        if topk > 1:
            from jaxserve.speculative.draft_tree import TreeDrafter

            self.tree = TreeDrafter(self, tgraph, dgraph)

    # ------------------------------------------------------------------ steps
    def step(self) -> list[Request]:
        """One prefill step if anything is to prefill, else one decode round. Returns finished requests."""
        batch = self.scheduler.schedule_prefill()
        if batch:
            return self.prefill(batch)
        reqs = self.scheduler.decoding()
        if reqs:
            return self.decode(reqs)
        if not self.scheduler.idle:
            raise SchedulerStuckError(f"no progress with {len(self.scheduler.running)} running and "
                                      f"{len(self.scheduler.waiting)} waiting requests "
                                      f"({self.kv.available_slots()} slots free)")
        return []

    def prefill(self, batch: list[ScheduledSeq]) -> list[Request]:
        inp = build_step_input(batch, self.kv, self.buckets)
        num_tokens = inp.meta.num_tokens
        next_ids = np.zeros(num_tokens, np.int32)
        from_sample = np.full(num_tokens, -1, np.int32)
        t = 0
        for row, seq in enumerate(batch):
            stop = seq.start + seq.num_tokens
            nxt = seq.req.fill_ids()[seq.start + 1: stop + 1]
            next_ids[t: t + nxt.shape[0]] = nxt
            if seq.samples:
                from_sample[t + seq.num_tokens - 1] = row
            t += seq.num_tokens
        self.kv.pools, self.dpool, out, first, hidden, top1 = self._prefill(
            self.tparams, self.dparams, self.kv.pools, self.dpool, self.emb, inp.input_ids, next_ids,
            from_sample, inp.meta, inp.sampling)
        token_ids, logprobs = np.asarray(out.token_ids), np.asarray(out.logprobs)
        (first, first_logp), hidden = (np.asarray(x) for x in first), np.asarray(hidden)
        self._record(inp.meta, t, top1)
        self.stats["prefill_steps"] += 1
        for row, seq in enumerate(batch):
            if seq.samples:
                self.state[seq.req] = (first[row], first_logp[row], hidden[row])
                if seq.req.spec_accept_lengths is None:
                    seq.req.spec_accept_lengths = []
        finished = self.scheduler.process(batch, token_ids, logprobs)
        for req in finished:
            self.state.pop(req, None)
        return finished

    def _make_room(self, reqs: list[Request]) -> list[Request]:
        """Free slots for every request's verify span (the draft's scratch is a subset), evicting tree nodes
        and then retracting the newest running requests. Returns the requests still decoding."""
        kv = self.kv
        while reqs:
            need = sum(kv.pages_for(r.num_computed + self.num_reserve) - kv.pages_for(r.num_computed)
                       for r in reqs) * kv.page_size
            kv._make_room(need)
            if kv.available_slots() >= need:
                return reqs
            victim = self.scheduler.retract_newest()
            self.state.pop(victim, None)
            reqs = [r for r in reqs if r.status is Status.RUNNING]
        return reqs

    def _draft(self, reqs: list[Request], starts: list[int]) -> jax.Array | np.ndarray:
        """S draft tokens per request `[seq bucket, S]` (device), draft KV written to borrowed slots."""
        kv, steps = self.kv, self.num_steps
        num_rows = pick_bucket(len(reqs), self.seq_buckets, "num_seqs")
        first = np.zeros(num_rows, np.int32)
        example = self.state[reqs[0]][2]
        hidden = np.zeros((num_rows, example.shape[0]), example.dtype)
        for i, req in enumerate(reqs):
            first[i], hidden[i] = self.state[req][0][0], self.state[req][2]
        if steps == 1:
            return first[:, None]
        backup = kv.allocator.state
        if not kv.extend_many([(r.cached, n, n + steps - 1) for r, n in zip(reqs, starts, strict=True)]):
            raise RuntimeError("draft scratch allocation failed after room was made (a bug)")
        pages = [kv.page_ids(r.cached, n + steps - 1)[0] for r, n in zip(reqs, starts, strict=True)]
        width = pick_bucket(max(p.shape[0] for p in pages), self.page_buckets, "pages_per_sequence")
        metas = [build_attention_metadata(
            [SequenceStep(1, n + k, p) for n, p in zip(starts, pages, strict=True)], page_size=kv.page_size,
            token_buckets=self.seq_buckets, seq_buckets=self.seq_buckets, page_buckets=(width,))
            for k in range(1, steps)]
        stacked = jax.tree.map(lambda *xs: np.stack(xs), *metas)
        self.dpool, drafts = self._draft_chain(self.dparams, self.dpool, self.emb, first, hidden, stacked)
        for req, n in zip(reqs, starts, strict=True):
            req.cached.kv_slots = req.cached.kv_slots[:n]
        kv.allocator.state = backup  # the scratch slots go back: nothing was freed since the backup
        return drafts

    def decode(self, reqs: list[Request]) -> list[Request]:
        reqs = self._make_room(reqs)
        if not reqs:
            return []
        starts = [r.num_computed for r in reqs]
        if self.tree is not None:
            results, aux = self.tree.draft_and_verify(reqs, starts)
        else:
            results, aux = self._verify_chain(reqs, starts, self._draft(reqs, starts))
        return self._accept(reqs, starts, results, aux)

    def _verify_chain(self, reqs, starts, drafts):
        """Verify the chains; per request (accepted drafts, new tokens, their logprobs, verify rows of the
        accepted positions) and the verify's captured states."""
        kv, nv = self.kv, self.num_verify
        if not kv.extend_many([(r.cached, n, n + nv) for r, n in zip(reqs, starts, strict=True)]):
            raise RuntimeError("verify allocation failed after room was made (a bug)")
        steps, rows = [], []
        last = np.zeros(drafts.shape[0], np.int32)
        for i, (req, n) in enumerate(zip(reqs, starts, strict=True)):
            full, swa = kv.page_ids(req.cached, n + nv)
            steps.append(SequenceStep(nv, n + nv, full, swa))
            last[i] = req.output_ids[-1]
            done = len(req.output_ids)
            rows += [SamplingRow(req.params, req.seed, done + j) for j in range(nv)]
        rows += [SamplingRow(_PAD_PARAMS, 0, 0)] * ((drafts.shape[0] - len(reqs)) * nv)
        meta = build_attention_metadata(steps, page_size=kv.page_size, with_swa=kv.hybrid,
                                        token_buckets=self.verify_tokens, seq_buckets=self.seq_buckets,
                                        page_buckets=self.page_buckets)
        out = self._verify(self.tparams, self.kv.pools, last, drafts, meta,
                           build_sampling_batch(rows, meta.num_tokens))
        self.kv.pools, aux = out[0], out[-1]
        accept, correction, logp_prop, logp_corr, drafts = (np.asarray(x) for x in out[1:-1])
        results = []
        for i in range(len(reqs)):  # the leading accepted drafts, then the correction (or bonus) token
            accepted = int(np.cumprod(accept[i, :-1]).sum())
            new = [*drafts[i, :accepted].tolist(), int(correction[i, accepted])]
            logps = [*logp_prop[i, :accepted].tolist(), float(logp_corr[i, accepted])]
            results.append((accepted, new, logps, list(range(i * nv, i * nv + accepted + 1))))
        return results, aux

    def _accept(self, reqs, starts, results, aux) -> list[Request]:
        """Append the new tokens, free whole pages past the new end, draft-extend over the accepted positions
        (also for finishing requests: the tree caches them), finish requests."""
        kv = self.kv
        finished, ext_steps, ext_ids, ext_rows = [], [], [], []
        for req, n, (accepted, new, logps, rows) in zip(reqs, starts, results, strict=True):
            req.spec_accept_lengths.append(accepted)
            self.stats["rounds"] += 1
            self.stats["verified"] += self.num_steps
            self.stats["accepted"] += accepted
            for token, logprob in zip(new, logps, strict=True):
                req.logprobs.append(logprob)
                if req.stop.append(token) is not None:
                    finished.append(req)
                    break
            end = n + accepted + 1
            slots = req.cached.kv_slots
            tail = slots[kv.pages_for(end) * kv.page_size:]
            if tail.shape[0]:
                kv.allocator.free(tail)
            req.cached.kv_slots = slots[:end]
            req.num_computed = end
            ext_steps.append(SequenceStep(accepted + 1, end, kv.page_ids(req.cached, end)[0]))
            ext_ids.extend(new)
            ext_rows.extend(rows)
        meta = build_attention_metadata(ext_steps, page_size=kv.page_size, token_buckets=self.verify_tokens,
                                        seq_buckets=self.seq_buckets, page_buckets=self.page_buckets)
        ids = np.zeros(meta.num_tokens, np.int32)
        rows = np.zeros(meta.num_tokens, np.int32)
        ids[: len(ext_ids)], rows[: len(ext_rows)] = ext_ids, ext_rows
        self.dpool, first, hidden, top1 = self._draft_extend(self.dparams, self.dpool, self.emb, ids, aux,
                                                             rows, meta)
        (first, first_logp), hidden = (np.asarray(x) for x in first), np.asarray(hidden)
        self._record(meta, len(ext_ids), top1)
        for i, req in enumerate(reqs):
            self.state[req] = (first[i], first_logp[i], hidden[i])
        for req in finished:
            self.scheduler.finish(req)
            self.state.pop(req, None)
        return finished

    def record_draft_top1(self) -> None:
        """Start keeping `slot_top1` (costs a device-to-host copy of T ids per prefill / draft extend)."""
        self.slot_top1 = np.full(self.dpool.data.shape[1], -1, np.int64)

    def _record(self, meta, num_tokens: int, top1) -> None:
        if self.slot_top1 is not None:
            self.slot_top1[np.asarray(meta.write_slots)[:num_tokens]] = np.asarray(top1)[:num_tokens]

    # ------------------------------------------------------------------ bookkeeping
    def forget(self, req: Request) -> None:
        """Drop a request's draft state (abort)."""
        self.state.pop(req, None)

    @property
    def num_compiles(self) -> dict[str, int]:
        return {"prefill": self._prefill._cache_size(), "draft_chain": self._draft_chain._cache_size(),
                "verify": self._verify._cache_size(), "draft_extend": self._draft_extend._cache_size()}

    @property
    def acc_length(self) -> float:
        """Pooled tokens per verify round so far (accepted drafts + 1)."""
        rounds = self.stats["rounds"]
        return (self.stats["accepted"] + rounds) / rounds if rounds else 0.0
