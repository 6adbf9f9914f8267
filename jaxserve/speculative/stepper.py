"""`EagleStepper`: EAGLE-3 speculative decoding behind the engine's `Stepper` seam (chain drafting; tree
drafting in `draft_tree`), verified by greedy matching or exact rejection sampling (`rejection.verify_tree`).

State of a decoding request with `n = num_computed` (EAGLE-3's draft reads the target's hidden states one
position behind the token it is fed, so its state always trails the target by one token): target
KV and draft KV at positions `[0, n)`, the last token `x` (position n) known but not computed, and from the
draft's last step its best next tokens (`d1` for position n + 1) with the draft hidden state that produced
them. That state stays on device (`draft_state`): a round reads its rows with an index array, no sync.

Prefill step: the target runs the chunk (writing its KV, capturing `aux` hidden states, sampling at the end of
the prompt with the request's penalties), then the draft runs over the same positions and slots with the
input ids shifted left by one - position i gets token i + 1, the last one the token just sampled - in the
same jitted call. This shift is why the prefix tree keys bigrams (`KVCache(eagle=True)`): the draft KV at i
is valid only next to token i + 1.

Chain round (one per step, for every decoding request): ONE jitted call, then ONE read of the verdict
(4 small arrays) by the host.
1. The host plans the round (`round_plan`, the same planner for chains and trees, which differ only in
   their jitted programs): slots for positions n .. n+S (the verify span), all the request's own; the S-1
   draft steps write their scratch draft KV into the first S-1 of them (positions n .. n+S-2), a Python
   loop unrolled under jit with no host sync between steps.
2. Verify: the target runs over `[x, d1 .. dS]` (causal: a chain); `rejection.verify_tree` walks it (greedy
   match or rejection sampling, penalties counting the drafted tokens) and the penalty pool counts the
   emitted tokens.
3. Draft extend over positions n .. n+S with the emitted tokens as next tokens, reading the verify's
   captured states: exact over the accepted positions n .. n+a (all the prefix tree caches and the next
   round reads); it stores the next draft state.
The host then appends the a accepted drafts plus the correction or bonus token, frees the slots of whole
pages past the new end n + a + 1, and finishes the requests a stop rule ended: their draft KV is already
extended, so every position the tree caches has draft KV computed with its true next token.

Plain step (adaptive speculation, `policy.choose_draft_steps`): per decode step the stepper runs either a
round or a plain step, from the running batch size and what it measured (seconds per step of each kind
in this batch-size bucket, acceptance so far). A plain step is the plain engine's step plus one write: the
target decodes `x` at position n and samples `y`, and its captured states at n go to the request's aux
ring; the draft extend at n (fed `y`) is deferred (`lazy_draft`) and runs batched over every deferred
position when the request goes back to rounds, when its ring fills, or when it finishes, leaving exactly
the state rounds would have left (the draft KV, and at the last position `d1`). Switching back to rounds
therefore stays lossless and keeps the draft's acceptance. Once the policy has measured that plain steps win
at the running batch size (`policy.settled_on_plain`), the requests decoding then drop their drafts instead
(`DraftLag.detach`): no catch-up runs for them, no round runs while one of them decodes, and the prefix
tree caches each of them only up to the position where its draft KV stops. Plain steps overlap like the
plain stepper's: a plain step after a plain step reads its pending last token on device. With
`record_draft_top1` a plain step is the prefill program over one token per request (target and draft
extend at once).

Overlapped rounds (chains and trees; the default unless `disable_overlap_schedule`): a decode step
dispatches round t+1 before reading round t's verdict, then applies round t while the device runs t+1, so
the host's bookkeeping hides behind device work. Round t+1 is planned for each request as if round t
advanced it the most it can (start n + S + 1 for a chain, slots allocated that far) and moved back on device
(`shift.continue_round`) by what round t accepted; its last token and output count come from round t's
verdict too (kept per state row in `shifts`). A request that finished in round t ran round t+1 for
nothing: its results there are dropped, its slots are already back (device order keeps the late writes
ahead of any reuse). A prefill, or nothing left to decode, or a switch between rounds and plain steps,
first applies the step in flight (`drain`). A prefill step stays in flight too: the plain step
after it reads its samples on device. `record_draft_top1` and steps with a grammar-constrained request
run synchronously. Sampled outputs are the same under both schedules (same steps, same keys).

Constrained round (any request with a grammar): two calls with the host between them. `draft_chain`
drafts the chains and the host reads them; `grammar_draft.walk_drafts` advances each grammar along its
chain, giving every verify node the mask of the grammar state there, substituting tokens the grammar
forces and cutting the chain at the first draft it refuses, and rolls the matcher back; `verify_chain`
verifies with those masks (the fused round's second half). Constrained requests are walked by matching the
plain sampler's own draw at each node (same masked logits, same key), so their output equals the plain
engine's constrained decoding token for token, greedy or seeded; the others verify as in a fused round. The
matcher then advances over the emitted tokens as they are appended. Tree drafting (`topk > 1`) splits its
round the same way (`draft_tree`, `grammar_draft.walk_tree`).

Memory: room for the round's slots is made (evicting, then retracting the newest request) before anything is
allocated. Compiled shapes: prefill per (tokens, seqs, pages) bucket; the round (chain or tree) per
(seqs, pages) bucket (the verify's token count is padded to seqs * its nodes), and likewise a constrained
round's two halves once a grammar runs. Sampling parameters and grammar masks are data, not shapes.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from jaxserve.engine import host_read, prompt_logprobs
from jaxserve.engine.errors import SchedulerStuckError
from jaxserve.engine.kv_cache import KVCache
from jaxserve.engine.program_cache import program_factory
from jaxserve.engine.request import Request, Status
from jaxserve.engine.row_pool import RowPool
from jaxserve.engine.runner import Bucket, ModelRunner, Programs, largest_first, programs_requested
from jaxserve.engine.step_input import (
    Buckets,
    ScheduledSeq,
    StepInput,
    build_step_input,
    pad_meta,
    pad_sampling,
    pad_step_input,
    pad_to,
    padding_step_input,
    step_bucket,
)
from jaxserve.layers.attention_metadata import pick_bucket
from jaxserve.models.decoder import CausalLM
from jaxserve.sampling import build_sampling_batch, sample, update_counts
from jaxserve.sampling.logprobs import next_token_logprobs
from jaxserve.speculative.draft_state import extend_and_store, greedy_ids, new_states, store
from jaxserve.speculative.draft_tree import make_tree_programs, repad_tree_draft, repad_tree_verify
from jaxserve.speculative.eagle3_draft import Eagle3Draft, make_draft_pool
from jaxserve.speculative.grammar_draft import walk_drafts, walk_tree
from jaxserve.speculative.lazy_draft import (
    DraftLag,
    Span,
    catch_up_input,
    make_lazy_programs,
    repad_catch_up,
    repad_plain_capture,
    take_spans,
)
from jaxserve.speculative.policy import CostMeter, StepCosts, choose_draft_steps, settled_on_plain
from jaxserve.speculative.rejection import Verdict, chain_children, chain_parents, count_emitted, verify_tree
from jaxserve.speculative.round_plan import RoundPlan, RoundPlanner, repad_round
from jaxserve.speculative.schedule import SpecScheduler
from jaxserve.speculative.shift import continue_round

# plain decode steps a request may take before its deferred draft extend must catch up (`lazy_draft`)
AUX_RING = 16


@program_factory(maxsize=16)
def _make_fns(tgraph, dgraph, num_steps: int, topk: int, num_verify: int, max_seqs: int, record: bool):
    """The jitted pieces for one (target, draft) graph pair, chain length and branching (prefill and draft
    extend store the draft's `topk` best next tokens with their log-probabilities): the prefill program,
    then the round program and a constrained round's two halves, a chain's or (`topk > 1`) a tree's
    (`draft_tree.make_tree_programs`), and last the prefill's prompt-logprobs variant. `record`: also
    return the draft's top-1 at every extended position (diagnostics)."""

    def target_of(params):
        return nnx.merge(tgraph, params)

    def draft_of(params):
        return nnx.merge(dgraph, params)

    extend = functools.partial(extend_and_store, topk=topk, record=record)

    def make_prefill(all_positions: bool):
        @functools.partial(jax.jit, donate_argnames=("pools", "dpool", "penalties", "states"))
        def prefill(tparams, dparams, pools, dpool, penalties, states, emb, prev_tokens, prev_rows, input_ids,
                    next_ids, from_sample, meta, sampling, dest, prompt_next=None):
            """Target step + sampling + draft extend over the same positions (a prefill chunk, or one decode
            token per request: the plain step that keeps the draft usable). Tokens flagged in `prev_rows`
            come from the previous plain step's samples `prev_tokens` (overlap); returns this step's samples
            padded to `max_seqs` for the next one. The `all_positions` variant keeps the target's logits
            at every position and also returns, for `prompt_next i32[T]`, each token's raw logprob of its
            next prompt token and the top ones (`engine.prompt_logprobs`), from the same forward."""
            input_ids = jnp.where(prev_rows >= 0, prev_tokens[jnp.maximum(prev_rows, 0)], input_ids)
            logits, pools, aux = target_of(tparams)(input_ids, meta, pools, return_all_logits=all_positions)
            every = logits
            if all_positions:
                logits = every[meta.sample_idx]
            out = sample(logits, sampling, penalties)
            penalties = update_counts(penalties, sampling.penalty_rows, out.token_ids)
            ids = jnp.where(from_sample >= 0, out.token_ids[jnp.maximum(from_sample, 0)], next_ids)
            dpool, states, top1 = extend(draft_of(dparams), ids, aux, meta, dpool, emb, states, dest,
                                         meta.sample_idx)
            next_tokens = jnp.zeros(max_seqs, jnp.int32).at[: out.token_ids.shape[0]].set(out.token_ids)
            if not all_positions:
                return pools, dpool, penalties, states, next_tokens, out, top1
            return (pools, dpool, penalties, states, next_tokens, out, top1,
                    next_token_logprobs(every, prompt_next))

        return prefill

    def draft_chain(dparams, dpool, states, emb, state_rows, draft_metas):
        """The chains' drafts `i32[R, S]`: d1 from each request's stored draft state, then S-1 draft steps
        (their scratch draft KV written at positions n .. n+S-2, overwritten by the round's draft extend)."""
        top_ids, _, hidden = (x[state_rows] for x in states)
        first = top_ids[:, 0]
        draft = draft_of(dparams)
        ids, drafts = first, [first]
        for k in range(num_steps - 1):
            dmeta = jax.tree.map(lambda x, k=k: x[k], draft_metas)
            logits, out, dpool = draft(ids, hidden, dmeta, dpool, emb)
            hidden = out[dmeta.sample_idx]
            ids = greedy_ids(draft, logits)
            drafts.append(ids)
        return dpool, jnp.stack(drafts, axis=1)

    def verify_chain(tparams, dparams, pools, dpool, penalties, states, shifts, emb, dest, last, drafts,
                     depth, exact, meta, sampling):
        """Verify the chains `[last, drafts]`, walk them, count the emitted tokens, draft-extend over the
        verified span and store the next draft state. `depth i32[R]` (None: all S): drafts each chain keeps
        (later nodes are not tried); `exact bool[R]` (None: none): rows walked by matching the plain
        sampler's draws (`rejection.verify_tree`). `sampling` counts outputs before the round: node j
        samples output g + j."""
        nodes = num_steps + 1
        rows = drafts.shape[0]
        sampling = dataclasses.replace(sampling, num_generated=sampling.num_generated
                                       + jnp.tile(jnp.arange(nodes, dtype=jnp.int32), rows))
        tokens = jnp.concatenate([last[:, None], drafts], axis=1)
        logits, pools, aux = target_of(tparams)(tokens.reshape(-1), meta, pools, return_all_logits=True)
        children = jnp.broadcast_to(jnp.asarray(chain_children(nodes)), (rows, nodes, 1))
        if depth is not None:
            children = jnp.where(jnp.arange(nodes)[None, :, None] < depth[:, None, None], children, -1)
        parents = jnp.broadcast_to(jnp.asarray(chain_parents(nodes)), (rows, nodes))
        verdict = verify_tree(logits, tokens, children, sampling, max_depth=num_steps, pool=penalties,
                              parents=parents, exact=exact)
        penalties = count_emitted(penalties, verdict, sampling.penalty_rows.reshape(rows, nodes)[:, 0])
        # draft extend over positions n .. n+S with the emitted tokens as next tokens (chain: node j is at
        # position n + j, its captured state is aux's row): exact up to n + a, which is all the tree caches
        # and all the next round reads; the KV past it is overwritten before anything attends to it
        last_idx = jnp.arange(rows) * nodes + verdict.num_accepted
        dpool, states, top1 = extend(draft_of(dparams), verdict.emitted.reshape(-1), aux, meta, dpool, emb,
                                     states, dest, last_idx)
        last_tok = jnp.take_along_axis(verdict.emitted, verdict.num_accepted[:, None], axis=1)[:, 0]
        shifts = store(shifts, dest, (verdict.num_accepted, last_tok))
        return pools, dpool, penalties, states, shifts, verdict, top1

    @functools.partial(jax.jit, donate_argnames=("pools", "dpool", "penalties", "states", "shifts"))
    def chain_round(tparams, dparams, pools, dpool, penalties, states, shifts, emb, state_rows, dest, shifted,
                    last, draft_metas, meta, sampling):
        """`draft_chain` then `verify_chain` over full chains: one call, no host sync. Sequences flagged
        `shifted` continue the previous round on device (`shift.continue_round`): start, last token and
        output count come from that round's verdict, kept per state row in `shifts` (accepted drafts, last
        emitted token)."""
        last, draft_metas, meta, sampling = continue_round(shifts, state_rows, shifted, last, draft_metas,
                                                           meta, sampling, advance=num_steps + 1)
        dpool, drafts = draft_chain(dparams, dpool, states, emb, state_rows, draft_metas)
        return verify_chain(tparams, dparams, pools, dpool, penalties, states, shifts, emb, dest, last,
                            drafts, None, None, meta, sampling)

    prefill_program = Programs(make_prefill(False), "prefill", fixed=(0, 1, 6))
    # last in the tuple: the prefill of a step with a request that wants prompt logprobs
    prompt_program = Programs(make_prefill(True), "prompt_prefill", fixed=(0, 1, 6))
    if topk > 1:
        return (prefill_program, *make_tree_programs(tgraph, dgraph, num_steps, topk, num_verify, record),
                prompt_program)
    # a constrained round's two halves (the host walks the grammars between them: `grammar_draft`)
    draft_program = jax.jit(draft_chain, donate_argnames=("dpool",))
    verify_program = jax.jit(verify_chain,
                             donate_argnames=("pools", "dpool", "penalties", "states", "shifts"))
    # fixed arguments: target params, draft params, embedding table (see `Programs`)
    return (prefill_program,
            Programs(chain_round, "chain_round", fixed=(0, 1, 7)),
            Programs(draft_program, "draft_chain", fixed=(0, 3)),
            Programs(verify_program, "verify_chain", fixed=(0, 1, 7)),
            prompt_program)


def _repad_prefill(args: tuple, bucket: Bucket) -> tuple:
    """The prefill program's arguments padded to the bucket (tokens, seqs, pages): the StepInput parts as
    `build_step_input` pads, next ids 0, no token taken from a sample, padding rows' draft states dropped
    (written to the out-of-range row)."""
    t, s, p = bucket
    states, (prev_rows, input_ids, next_ids, from_sample, meta, sampling, dest) = args[5], args[8:]
    inp = pad_step_input(StepInput(input_ids, prev_rows, meta, sampling), t, s, p)
    return (*args[:8], inp.prev_rows, inp.input_ids, pad_to(next_ids, (t,)), pad_to(from_sample, (t,), -1),
            inp.meta, inp.sampling, pad_to(dest, (s,), states[0].shape[0]))


def _repad_prompt_prefill(args: tuple, bucket: Bucket) -> tuple:
    """`_repad_prefill` of the prompt-logprobs variant (its last argument, the next prompt ids, padded
    with 0)."""
    return (*_repad_prefill(args[:-1], bucket), pad_to(args[-1], (bucket[0],)))


def _repad_draft(args: tuple, bucket: Bucket) -> tuple:
    """`draft_chain`'s arguments padded to the bucket (seqs, pages): padding requests read state row 0."""
    s, p = bucket
    state_rows, draft_metas = args[4:]
    if draft_metas is not None:
        draft_metas = pad_meta(draft_metas, s, s, p)
    return (*args[:4], pad_to(state_rows, (s,)), draft_metas)


def _repad_verify(args: tuple, bucket: Bucket) -> tuple:
    """`verify_chain`'s arguments padded to the bucket (seqs, pages): padding requests store nothing
    (out-of-range row), verify greedy padding rows with no mask and are not matched exactly."""
    s, p = bucket
    states, (dest, last, drafts, depth, exact, meta, sampling) = args[5], args[8:]
    nodes = drafts.shape[1] + 1
    return (*args[:8], pad_to(dest, (s,), states[0].shape[0]), pad_to(last, (s,)), pad_to(drafts, (s, None)),
            pad_to(depth, (s,)), pad_to(exact, (s,), False), pad_meta(meta, s * nodes, s, p),
            pad_sampling(sampling, s * nodes))


@dataclasses.dataclass(frozen=True)
class _Round:
    """A dispatched round (chain or tree): its requests (verdict row order), the device verdict, and for
    diagnostics the host-built verify metadata and the extend's top-1 ids."""

    reqs: list[Request]
    members: frozenset
    verdict: Verdict
    meta: object
    top1: jax.Array


@dataclasses.dataclass(frozen=True)
class _PlainStep:
    """A dispatched prefill-program step: its batch, the device samples, and for diagnostics the metadata,
    the real token count and the extend's top-1 ids."""

    batch: list[ScheduledSeq]
    out: object
    meta: object
    num_tokens: int
    top1: jax.Array
    prompt: tuple | None = None  # prompt logprobs (`engine.prompt_logprobs`), device arrays; None: none


class EagleStepper:
    """Runs speculative steps for an engine: owns its scheduler (`SpecScheduler`, whose hooks are this
    stepper's), the draft, its KV pool and the per-request draft state. `runner` (the engine's ModelRunner)
    holds the penalty pool that prefill and verify read and update.

    Tensor parallelism (`kv.mesh` set): the target stays sharded as the engine placed it, and the draft's
    parameters, its KV pool and the draft state are REPLICATED on every device of the mesh. A round runs
    several small sequential draft steps on one layer; sharding them would add collectives to every draft
    step for a model that small, so each device computes the whole draft itself (its memory is one layer's
    weights and a one-layer pool per device)."""

    def __init__(self, target: CausalLM, draft: Eagle3Draft, kv: KVCache, buckets: Buckets, *,
                 runner: ModelRunner, max_tokens: int, max_running: int, num_steps: int,
                 context_length: int, topk: int = 1, num_draft_tokens: int | None = None,
                 overlap: bool = True, policy: str = "auto", disable_batch_size: int | None = None) -> None:
        if tuple(target.aux_hidden_state_layer_ids) != tuple(draft.config.aux_layer_ids):
            raise ValueError(f"the target captures layers {target.aux_hidden_state_layer_ids} but the draft "
                             f"reads {draft.config.aux_layer_ids}: load the target with "
                             f"aux_hidden_state_layer_ids={tuple(draft.config.aux_layer_ids)}")
        tgraph, self.tparams = nnx.split(target)
        dgraph, self.dparams = nnx.split(draft)
        self.kv, self.buckets, self.runner = kv, buckets, runner
        self.num_steps = num_steps
        self.topk = topk
        self.num_verify = num_steps + 1 if topk == 1 else num_draft_tokens
        # slots a round needs past the last computed position: the verify span, or the tree's draft scratch
        self.num_reserve = max(self.num_verify, (num_steps - 1) * topk)
        self.emb = target.embed.embed.embedding[...]
        self.dpool = make_draft_pool(draft.config, kv.num_pages, kv.page_size, draft.config.jnp_dtype)
        self.seq_buckets = tuple(buckets.seqs)
        # the programs per `record` flag, looked up without re-hashing the graphs (an nnx graph's hash walks
        # the whole module tree: ~0.7 ms per lookup, several lookups per step)
        self._fns = functools.cache(functools.partial(_make_fns, tgraph, dgraph, num_steps, topk,
                                                      self.num_verify, max(self.seq_buckets)))
        self.last_tokens = jnp.zeros(max(self.seq_buckets), jnp.int32)  # the last plain step's samples
        # an overlapped round reaches up to 2 verify spans past the last applied position
        most_pages = min(kv.pages_for(context_length + 2 * self.num_reserve), kv.num_pages)
        self.page_buckets = tuple(sorted({*buckets.pages, max(most_pages, max(buckets.pages))}))
        # chains and trees: the same slots and step inputs, different programs
        self.planner = RoundPlanner(kv, num_steps=num_steps, width=topk, num_verify=self.num_verify,
                                    seq_buckets=self.seq_buckets, page_buckets=self.page_buckets)
        # per decoding request, a row of the device state buffer: the draft's `topk` best next tokens, their
        # log-probabilities and the draft hidden state that produced them (written by prefill and draft
        # extend, read by the next round: never transferred to the host)
        num_state_rows = max(self.seq_buckets)
        self.states = new_states(num_state_rows, topk, draft.config.hidden_size, draft.config.jnp_dtype)
        self.rows = RowPool(num_state_rows)  # which request owns which row of `states` and `shifts`
        # per state row, the last round's accepted drafts and last emitted token (read by an overlapped round)
        self.shifts = (jnp.zeros(num_state_rows, jnp.int32), jnp.zeros(num_state_rows, jnp.int32))
        # overlapped schedule: the dispatched round or plain step whose results the host has not applied yet
        self.overlap = overlap
        self.inflight: _Round | _PlainStep | None = None
        # plain decode steps defer the draft extend (`lazy_draft`): which requests' draft trails from where,
        # and which dropped it (the prefix tree caches their positions with draft KV only)
        self.lag = DraftLag(AUX_RING)
        self.scheduler = SpecScheduler(kv, max_tokens=max_tokens, max_running=max_running,
                                       set_penalty_row=runner.set_penalty_row,
                                       has_state=self.rows.__contains__, on_retract=self.forget,
                                       before_finish=self._before_finish, cache_limit=self.lag.detached.get)
        # diagnostics (off by default): slot -> the draft's top-1 (target id) computed with the draft KV
        # the slot holds, i.e. its prediction for the token two positions on; -1 = never written
        self.slot_top1: np.ndarray | None = None
        # also per decode-step kind (round / plain): the steps' wall seconds and their main thread's CPU
        # seconds (the host's work: waiting for the device costs no CPU time); and the part of the rounds'
        # CPU seconds spent in the call that dispatches an unconstrained round's program (argument
        # signatures, packing, the executable call)
        self.stats = {"steps": 0, "prefill_steps": 0, "rounds": 0, "verified": 0, "accepted": 0,
                      "reached": 0, "tree_kv_moved": 0, "plain_decode_steps": 0, "round_steps": 0,
                      "draft_catch_ups": 0, "drafts_dropped": 0, "round_wall_s": 0.0, "round_host_cpu_s": 0.0,
                      "round_dispatch_cpu_s": 0.0, "plain_wall_s": 0.0, "plain_host_cpu_s": 0.0}
        # adaptive speculation: per decode step, plain (0 draft steps) or a full round (`policy`)
        choose_draft_steps(1, options=(0, num_steps), policy=policy)  # refuses an unknown policy now
        self.policy, self.disable_batch_size = policy, disable_batch_size
        self.options = (0, num_steps)
        self.costs: dict[int, CostMeter] = {}  # per seq bucket
        # per decoding request, over its own rounds: [drafts accepted, drafts whose parent was accepted]
        self.acceptance: dict[Request, list[int]] = {}
        self._prev_decode: tuple[int, int] | None = None  # (seq bucket, choice) of the last step if decode
        # per state row, the target's captured states at the last AUX_RING decoded positions
        self._finishing: list[Span] = []  # spans of lagging requests the step being applied finished
        self.aux_ring = jnp.zeros((num_state_rows, AUX_RING, draft.config.fc_in_features),
                                  target.config.jnp_dtype)
        self._lazy = make_lazy_programs(tgraph, dgraph, topk, max(self.seq_buckets), AUX_RING)
        if kv.mesh is not None:  # every draft-side argument replicated over the mesh (see the class)
            replicated = NamedSharding(kv.mesh, PartitionSpec())
            self.dparams, self.dpool, self.states, self.shifts, self.last_tokens, self.aux_ring = \
                jax.device_put((self.dparams, self.dpool, self.states, self.shifts, self.last_tokens,
                                self.aux_ring), replicated)

    def measured(self, batch_size: int) -> CostMeter:
        """What this stepper measured (and measures on) for decode steps of `batch_size` requests: the meter
        of its sequence bucket, which the policy reads each decode step."""
        return self.costs.setdefault(pick_bucket(batch_size, self.seq_buckets, "num_seqs"), CostMeter())

    def set_policy(self, policy: str) -> None:
        """Switch the speculation policy (`policy.POLICIES`) from the next decode step on; what was measured
        is kept."""
        choose_draft_steps(1, options=self.options, policy=policy)  # refuses an unknown policy
        self.policy = policy

    # ------------------------------------------------------------------ steps
    @property
    def idle(self) -> bool:
        """Nothing queued or running and no round or plain step in flight."""
        return self.scheduler.idle and self.inflight is None

    def step(self) -> list[Request]:
        """One prefill step if anything is to prefill, else one decode step (a round or a plain step, as the
        policy chooses). Returns finished requests. A step still in flight is applied first when a prefill
        comes (or nothing is left to decode)."""
        self.stats["steps"] += 1
        finished = []
        if self.inflight is not None and self._prefill_pending():
            finished = self.drain()
        batch = self.scheduler.schedule_prefill()
        if batch:
            self._prev_decode = None
            self.stats["prefill_steps"] += 1
            return finished + self.prefill(batch)
        reqs = self.scheduler.decoding()
        if reqs:
            return finished + self._decode_step(reqs)
        if self.inflight is not None:
            return finished + self.drain()
        if not self.scheduler.idle:
            raise SchedulerStuckError(f"no progress with {len(self.scheduler.running)} running and "
                                      f"{len(self.scheduler.waiting)} waiting requests "
                                      f"({self.kv.available_slots()} slots free)")
        return finished

    def _prefill_pending(self) -> bool:
        sched = self.scheduler
        return bool(sched.waiting) or any(r.status is Status.RUNNING and r not in self.rows
                                          for r in sched.running)

    def drain(self) -> list[Request]:
        """Apply the round or plain step in flight, if any (its requests end at their new length). Returns
        the finished requests."""
        done, self.inflight = self.inflight, None
        if done is None:
            return []
        if isinstance(done, _PlainStep):
            return self._apply_plain(done)
        return self._apply(done, ())

    def prefill(self, batch: list[ScheduledSeq]) -> list[Request]:
        """Dispatch a target step with the draft extend (see `_dispatch`). Under the overlap schedule it
        stays in flight like a plain step: the next step, a plain decode step, is built and dispatched
        while it runs and reads its samples on device (a prefill, a round, or a grammar's need for the
        token on the host applies it first); otherwise it is applied now."""
        step = self._dispatch(batch, None)
        if self.overlap and self.slot_top1 is None:
            self.inflight = step
            return []
        return self._apply_plain(step)

    def _dispatch(self, batch: list[ScheduledSeq], prev: _PlainStep | None) -> _PlainStep:
        """Dispatch the prefill program over `batch` (prefill chunks, or one-token decodes). A decode
        whose last token is still pending (sampled by `prev`, in flight) reads it on device."""
        prev_rows = {} if prev is None else {s.req: row for row, s in enumerate(prev.batch) if s.samples}
        inp = build_step_input(batch, self.kv, self.buckets, prev_rows)
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
        dest = np.full(inp.sampling.num_rows, self.states[0].shape[0], np.int32)  # out of range: dropped
        for row, seq in enumerate(batch):
            if seq.samples:
                dest[row] = self.rows.acquire(seq.req)
                if seq.req.spec_accept_lengths is None:
                    seq.req.spec_accept_lengths = []
        runner = self.runner
        args = (self.tparams, self.dparams, self.kv.pools, self.dpool, runner.penalties, self.states,
                self.emb, self.last_tokens, inp.prev_rows, inp.input_ids, next_ids, from_sample, inp.meta,
                inp.sampling, dest)
        fns = self._fns(self.recording)
        prompt_next = prompt_logprobs.next_token_ids(batch, num_tokens)
        prompt = None
        if prompt_next is None:
            (self.kv.pools, self.dpool, runner.penalties, self.states, self.last_tokens, out,
             top1) = fns[0].call(step_bucket(inp), args, _repad_prefill)
        else:
            (self.kv.pools, self.dpool, runner.penalties, self.states, self.last_tokens, out, top1,
             prompt) = fns[-1].call(step_bucket(inp), (*args, prompt_next), _repad_prompt_prefill)
        return _PlainStep(batch, out, inp.meta, t, top1, prompt)

    def _apply_plain(self, done: _PlainStep) -> list[Request]:
        """Read a dispatched prefill-program step's samples and apply them (scheduler rules: requests
        aborted, retracted or finished since are skipped). Returns the finished requests."""
        out = done.out
        token_ids, logprobs = host_read.to_host(out.token_ids, out.logprobs)
        wanted = _wants_top(s.req for s in done.batch)
        top = host_read.to_host(out.top_ids, out.top_logprobs) if wanted else None
        self._record(done.meta, done.num_tokens, done.top1)
        if done.prompt is not None:
            prompt_logprobs.record(done.batch, *host_read.to_host(*done.prompt))
        finished = self.scheduler.process(done.batch, token_ids, logprobs, top)
        # lagging requests that finished: their draft KV completed before anything can reuse their slots
        spans, self._finishing = self._finishing, []
        self._extend_spans(spans)
        for req in finished:
            self.forget(req)
        return finished

    def _dispatch_capture(self, batch: list[ScheduledSeq], prev: _PlainStep | None) -> _PlainStep:
        """Dispatch a deferred plain decode step (`lazy_draft.plain_capture`): the target over one token per
        request, its captured states kept in the aux ring; the draft catches up later (`_catch_up`)."""
        prev_rows = {} if prev is None else {s.req: row for row, s in enumerate(prev.batch) if s.samples}
        inp = build_step_input(batch, self.kv, self.buckets, prev_rows)
        out_of_range = self.aux_ring.shape[0]  # dropped: padding rows, and requests without a draft
        dest = np.full(inp.sampling.num_rows, out_of_range, np.int32)
        dest[: len(batch)] = [out_of_range if s.req in self.lag.detached else self.rows[s.req] for s in batch]
        runner = self.runner
        (self.kv.pools, runner.penalties, self.aux_ring, self.last_tokens, out) = self._lazy[0].call(
            step_bucket(inp), (self.tparams, self.kv.pools, runner.penalties, self.aux_ring, self.last_tokens,
                               inp.prev_rows, inp.input_ids, inp.meta, inp.sampling, dest),
            repad_plain_capture)
        return _PlainStep(batch, out, inp.meta, inp.meta.num_tokens, None)

    def _catch_up(self, reqs: list[Request]) -> None:
        """Run the draft extends that plain steps deferred for the lagging `reqs`, in one call, up to the
        last position whose next token is on the host (`lazy_draft.take_spans`): with nothing in flight,
        their draft state is then what rounds would have left."""
        if reqs:
            self._extend_spans(take_spans(self.lag, reqs, [self.rows[r] for r in reqs], self.kv))

    def _before_finish(self, req: Request) -> None:
        """Scheduler hook: a request finishes now (its slots go to the prefix tree next); if its draft
        lags, keep its span for the catch-up after the step is applied (`_apply_plain`)."""
        if req in self.lag:
            self._finishing += take_spans(self.lag, [req], [self.rows[req]], self.kv)

    def _extend_spans(self, spans: list[Span]) -> None:
        if not spans:
            return
        ids, meta, rows = catch_up_input(spans, ring=AUX_RING, page_size=self.kv.page_size,
                                         num_rows=self.states[0].shape[0], seq_buckets=self.seq_buckets,
                                         page_buckets=self.page_buckets)
        self.stats["draft_catch_ups"] += 1
        self.dpool, self.states = self._lazy[1].call(
            (meta.num_tokens, meta.num_seqs, meta.page_table.shape[1]),
            (self.dparams, self.dpool, self.states, self.emb, self.aux_ring, ids, meta, rows), repad_catch_up)

    def _decode_step(self, reqs: list[Request]) -> list[Request]:
        """One decode step for every decoding request: a round, or a plain step, as the policy chooses from
        the batch size and what earlier steps measured (`policy.choose_draft_steps`)."""
        bucket = pick_bucket(len(reqs), self.seq_buckets, "num_seqs")
        costs = self.measured(len(reqs))
        choice, chosen = self._choose(reqs, costs.view())
        steady = self._prev_decode == (bucket, choice)
        compiles = programs_requested()
        t0, c0 = time.perf_counter(), time.thread_time()
        finished = []
        if choice and self.lag.lagging(reqs):  # back to rounds: the draft catches up first (all tokens known)
            finished = self.drain()
            reqs = [r for r in reqs if r.status is Status.RUNNING and r in self.rows]
            self._catch_up(self.lag.lagging(reqs))
        if reqs:
            finished += self.decode(reqs) if choice else self._plain(reqs)
        seconds = time.perf_counter() - t0
        kind = "round" if choice else "plain"
        self.stats[f"{kind}_wall_s"] += seconds
        self.stats[f"{kind}_host_cpu_s"] += time.thread_time() - c0
        # a step that finished requests also did their bookkeeping (prefix-tree inserts, catch-ups): the
        # same work whichever the choice, and it would skew the per-step costs the policy compares
        sample = steady and not finished and programs_requested() == compiles
        costs.record(choice, seconds if sample else None, chosen=chosen)
        self._prev_decode = (bucket, choice)
        self.stats["round_steps" if choice else "plain_decode_steps"] += 1
        return finished

    def _choose(self, reqs: list[Request], costs: StepCosts) -> tuple[int, bool]:
        """This decode step's draft steps (`policy.choose_draft_steps`), and whether the policy chose them:
        while a request without a draft decodes, the step is plain whatever the policy says. Once the
        policy has settled on plain steps at this batch size (`policy.settled_on_plain`), the requests
        decoding now drop their drafts (`DraftLag.detach`), new ones as they join: they save the deferred
        draft extends, and give up rounds for the rest of their decode (a retracted one gets its draft
        back with its recompute)."""
        detached = self.lag.detached
        num_detached = sum(r in detached for r in reqs)
        if num_detached == len(reqs):  # settled already: nothing to choose, nothing left to drop
            return 0, False
        rate, fresh = self.batch_acceptance(reqs)
        forced = num_detached > 0
        choice = 0 if forced else choose_draft_steps(
            len(reqs), options=self.options, policy=self.policy, disable_batch_size=self.disable_batch_size,
            accept_rate=rate, fresh=fresh, costs=costs)
        if not choice and not self.recording and settled_on_plain(
                len(reqs), options=self.options, policy=self.policy, accept_rate=rate, costs=costs):
            self.stats["drafts_dropped"] += self.lag.detach([r for r in reqs if r in self.rows])
        return choice, not forced

    def _plain(self, reqs: list[Request]) -> list[Request]:
        """A plain decode step that keeps the draft usable: the target decodes one token per request and
        keeps its captured states for the deferred draft extend (`_dispatch_capture`, caught up first if a
        ring would overflow; with diagnostics on, the prefill program extends at once), so a later round
        starts from exactly the state a round would have left (requests that dropped their draft keep
        nothing). Counts as a
        verify round that accepted no draft in each request's `spec_accept_lengths`. Overlapped (unless
        disabled, recording diagnostics or a grammar constrains a request) after another plain step:
        dispatch this one, then apply that one while the device runs this one (the plain stepper's
        schedule)."""
        # a grammar's next mask needs the request's last token on the host: no overlap while one runs
        overlap = self.overlap and self.slot_top1 is None and not any(r.grammar is not None for r in reqs)
        prev = self.inflight if overlap and isinstance(self.inflight, _PlainStep) else None
        finished = [] if prev is not None else self.drain()

        def live(rs: list[Request]) -> list[Request]:  # a request whose last token is in flight is done
            return [r for r in rs
                    if r.status is Status.RUNNING and r in self.rows and not r.last_token_in_flight]

        defer = not self.recording  # diagnostics record the draft's top-1 of every extend as it runs
        if defer and self.lag.ring_full(reqs):  # (only requests whose draft lags, so holding a row, count)
            # a ring column still needed would be overwritten: catch up over the positions whose next token
            # the host has (all but the one the step in flight feeds)
            self._catch_up(self.lag.lagging([r for r in reqs if r.status is Status.RUNNING
                                             and r in self.rows]))
        room = self._make_room(live(reqs), num_tokens=1, retract=prev is None)
        if room is None:  # short with a step in flight: apply it, then make room retracting if need be
            finished, prev = self.drain(), None
            room = self._make_room(live(reqs), num_tokens=1)
        if not room:
            return finished + self.drain()
        if defer:
            self.lag.defer(room)
        batch = self.scheduler.commit_decodes(room)
        for req in room:
            req.spec_accept_lengths.append(0)
        step = self._dispatch_capture(batch, prev) if defer else self._dispatch(batch, prev)
        if not overlap:
            return finished + self._apply_plain(step)
        self.inflight = step
        return finished + (self._apply_plain(prev) if prev is not None else [])

    @property
    def accept_rate(self) -> float | None:
        """Measured probability that a draft is accepted given its parent was (None before any round)."""
        reached = self.stats["reached"]
        return self.stats["accepted"] / reached if reached else None

    def batch_acceptance(self, reqs: list[Request]) -> tuple[float | None, bool]:
        """(`accept_rate` pooled over the rounds `reqs` themselves ran, else over every round so far; whether
        any of `reqs` has run no round yet). Acceptance depends on the text: a new request's drafts may be
        accepted whatever earlier requests saw."""
        accepted = reached = 0
        fresh = False
        for req in reqs:
            mine = self.acceptance.get(req)
            if mine is None:
                fresh = True
            else:
                accepted, reached = accepted + mine[0], reached + mine[1]
        return (accepted / reached if reached else self.accept_rate), fresh

    def _make_room(self, reqs: list[Request], prev: _Round | None = None, *, retract: bool = True,
                   num_tokens: int | None = None) -> list[Request] | None:
        """Free slots for every request's step (`num_tokens` each, default a round's verify span or tree
        scratch), evicting tree nodes and then (`retract`) retracting the newest running requests. Returns
        the requests still decoding; None when eviction alone is not enough and `retract` is False."""
        kv, ps = self.kv, self.kv.page_size
        num_tokens = self.num_reserve if num_tokens is None else num_tokens
        # a request needs slots up to `num_tokens` past num_computed, and past the furthest start the round
        # in flight can give it (num_computed + S + 1) when it is in it; in whole pages
        members, advance = (prev.members, self.planner.advance) if prev is not None else ((), 0)
        while reqs:
            need = sum(max(0, (r.num_computed + num_tokens + (advance if r in members else 0) + ps - 1) // ps
                           - (len(r.cached.kv_slots) + ps - 1) // ps) for r in reqs) * ps
            if kv.reserve(need):
                return reqs
            if not retract:
                return None
            self.scheduler.retract_newest()  # on_retract drops its draft state
            reqs = [r for r in reqs if r.status is Status.RUNNING]
        return reqs

    def state_rows(self, reqs: list[Request]) -> np.ndarray:
        """i32[seq bucket]: the requests' rows in the state buffer (padding rows read row 0)."""
        rows = np.zeros(pick_bucket(len(reqs), self.seq_buckets, "num_seqs"), np.int32)
        rows[: len(reqs)] = [self.rows[r] for r in reqs]
        return rows

    def decode(self, reqs: list[Request]) -> list[Request]:
        """One round for `reqs` (chains or trees alike). Overlapped (unless disabled, recording diagnostics
        or a grammar constrains a request): dispatch this round, then apply the previous one while the
        device runs this one; its requests that finished there ran this round for nothing, and their
        results here are dropped. Otherwise dispatch and apply. A plain step in flight is applied first."""
        if isinstance(self.inflight, _PlainStep):
            finished = self.drain()
            reqs = [r for r in reqs if r.status is Status.RUNNING and r in self.rows]
            return finished + (self.decode(reqs) if reqs else [])
        if self.overlap and self.slot_top1 is None and not any(r.grammar is not None for r in reqs):
            prev = self.inflight
            room = self._make_room(reqs, prev, retract=False)
            if room:  # else (a full pool): apply the round in flight and go on synchronously, retracting
                self.inflight = self._round(room, prev)
                return self._apply(prev, self.inflight.members) if prev is not None else []
        finished = self.drain()
        reqs = self._make_room([r for r in reqs if r.status is Status.RUNNING and r in self.rows])
        if not reqs:
            return finished
        return finished + self._apply(self._round(reqs, None), ())

    def _apply(self, rnd: _Round, next_members) -> list[Request]:
        """Read a dispatched round's verdict (the one read of it) and apply it to the requests still
        decoding; those in `next_members` (the round now in flight) keep slots for its span."""
        results = self.results(rnd.verdict, rnd.reqs)
        self.record_extend(rnd.meta, rnd.top1, results)
        if self.topk > 1:  # accepted nodes off the first branch, whose target KV the round moved
            nv = self.num_verify
            self.stats["tree_kv_moved"] += sum(int(v - i * nv != j) for i, (_, _, _, vrows, _) in
                                               enumerate(results) for j, v in enumerate(vrows))
        live = [(r, res) for r, res in zip(rnd.reqs, results, strict=True)
                if r.status is Status.RUNNING and r in self.rows]
        return self._finish(self._accept([r for r, _ in live], [res for _, res in live], next_members))

    def _finish(self, finished: list[Request]) -> list[Request]:
        for req in finished:  # the round's draft extend already ran: the tree caches its draft KV
            self.scheduler.finish(req)
            self.forget(req)
        return finished

    def _round(self, reqs: list[Request], prev: _Round | None) -> _Round:
        """Plan (`round_plan`) and dispatch a round: one call, or two with the host walking the grammars
        between them when a request is constrained. Requests in `prev` (in flight) are planned as if that
        round advanced them the most it can and moved back on device."""
        plan = self.planner.plan(reqs, self.state_rows(reqs), self.states[0].shape[0],
                                 prev.members if prev is not None else frozenset())
        if any(r.grammar is not None for r in reqs):
            verdict, top1 = self._constrained(plan)
        else:
            c0 = time.thread_time()
            (self.kv.pools, self.dpool, self.runner.penalties, self.states, self.shifts, verdict,
             top1) = self._fns(self.recording)[1].call(plan.bucket, (
                 self.tparams, self.dparams, self.kv.pools, self.dpool, self.runner.penalties, self.states,
                 self.shifts, self.emb, *plan.inputs), repad_round)
            self.stats["round_dispatch_cpu_s"] += time.thread_time() - c0
        return _Round(reqs, plan.members, verdict, plan.meta, top1)

    def _constrained(self, plan: RoundPlan) -> tuple[Verdict, jax.Array]:
        """A round with grammar-constrained requests, in two calls: draft (chains, or selected trees), read
        the drafts, walk each grammar along them (`grammar_draft.walk_drafts` / `walk_tree`: per-node masks,
        forced tokens, the cut at the first draft the grammar refuses), then verify with those masks.
        Constrained requests are walked by matching the plain sampler's draws, so their tokens are the plain
        engine's (greedy and seeded); the others as in a fused round."""
        fns = self._fns(self.recording)
        matchers = [r.grammar for r in plan.reqs]
        num_words = next(m for m in matchers if m is not None).num_words
        exact = np.zeros(plan.state_rows.shape[0], bool)
        exact[: len(plan.reqs)] = [m is not None for m in matchers]
        if self.topk > 1:
            prefix = np.maximum(plan.meta.kv_lens - self.num_verify, 0)
            self.dpool, *tree = fns[2].call(plan.bucket, (
                self.dparams, self.dpool, self.states, self.emb, plan.state_rows, plan.last, plan.draft_metas,
                prefix), repad_tree_draft)
            tokens, parents, depths, children = host_read.to_host(*tree)
            tokens, children, bitmask = walk_tree(matchers, tokens, parents, children, num_words)
            drafted, repad = (tokens, parents, depths, children, exact), repad_tree_verify
        else:
            self.dpool, drafts = fns[2].call(plan.bucket, (self.dparams, self.dpool, self.states, self.emb,
                                                           plan.state_rows, plan.draft_metas), _repad_draft)
            tokens, depth, bitmask = walk_drafts(matchers, host_read.to_host(drafts)[0], num_words)
            drafted, repad = (plan.last, tokens, depth, exact), _repad_verify
        sampling = dataclasses.replace(plan.sampling, token_bitmask=bitmask)
        (self.kv.pools, self.dpool, self.runner.penalties, self.states, self.shifts, verdict,
         top1) = fns[3].call(plan.bucket, (
             self.tparams, self.dparams, self.kv.pools, self.dpool, self.runner.penalties, self.states,
             self.shifts, self.emb, plan.dest, *drafted, plan.meta, sampling), repad)
        return verdict, top1

    def results(self, verdict: Verdict, reqs: list[Request]) -> list[tuple]:
        """The host's view of a verdict (one transfer): per request (accepted drafts, emitted tokens, their
        logprobs, verify rows of the nodes that produced them, and per emitted token its (top ids, top
        logprobs) - read only when a request asks for top logprobs, else empty arrays)."""
        nv = self.num_verify
        num_acc, emitted, logprobs, path = host_read.to_host(
            verdict.num_accepted, verdict.emitted, verdict.logprobs, verdict.path)
        top = host_read.to_host(verdict.top_ids, verdict.top_logprobs) if _wants_top(reqs) else None
        n = len(reqs)  # whole rows to Python lists at once, then cut per request
        num_acc, emitted, logprobs, path = (x[:n].tolist() for x in (num_acc, emitted, logprobs, path))
        out = []
        for i, a in enumerate(num_acc):
            tops = [(top[0][i, j], top[1][i, j]) for j in range(a + 1)] if top else [((), ())] * (a + 1)
            out.append((a, emitted[i][: a + 1], logprobs[i][: a + 1], [i * nv + p for p in path[i][: a + 1]],
                        tops))
        return out

    def _accept(self, reqs, results, next_members) -> list[Request]:
        """Append each request's new tokens (until a stop rule fires), move its end to n + a + 1 and free
        whole pages past it (past the span of the round in flight, for `next_members`). Returns the requests
        that finished (the caller finishes them)."""
        finished, shrinks = [], []
        for req, (accepted, new, logps, _, tops) in zip(reqs, results, strict=True):
            n = req.num_computed
            req.spec_accept_lengths.append(accepted)
            self.stats["rounds"] += 1
            self.stats["verified"] += self.num_steps
            self.stats["accepted"] += accepted
            self.stats["reached"] += min(accepted + 1, self.num_steps)  # drafts whose parent was accepted
            mine = self.acceptance.setdefault(req, [0, 0])
            mine[0], mine[1] = mine[0] + accepted, mine[1] + min(accepted + 1, self.num_steps)
            for token, logprob, top in zip(new, logps, tops, strict=True):
                if req.append_output(token, logprob, *top) is not None:
                    finished.append(req)
                    break
            end = n + accepted + 1
            shrinks.append((req.cached, end + (self.num_reserve if req in next_members else 0)))
            req.num_computed = end
        self.kv.shrink_many(shrinks)
        return finished

    @property
    def recording(self) -> bool:
        """Whether `record_draft_top1` is on (the jitted pieces then also return per-position top-1s)."""
        return self.slot_top1 is not None

    def record_draft_top1(self) -> None:
        """Start keeping `slot_top1` (costs a device-to-host copy of T ids per prefill / draft extend)."""
        self.slot_top1 = np.full(self.dpool.data.shape[1], -1, np.int64)

    def _record(self, meta, num_tokens: int, top1) -> None:
        if self.slot_top1 is not None:
            self.slot_top1[np.asarray(meta.write_slots)[:num_tokens]] = np.asarray(top1)[:num_tokens]

    def record_extend(self, meta, top1, results) -> None:
        """`_record` for a round's draft extend (`meta`: one chain of N tokens per request, request i's
        position n + j at row i*N + j): positions n .. n+a of each request."""
        if self.slot_top1 is not None:
            nv = self.num_verify
            keep = np.concatenate([i * nv + np.arange(a + 1) for i, (a, *_) in enumerate(results)])
            self.slot_top1[np.asarray(meta.write_slots)[keep]] = np.asarray(top1)[keep]

    # ------------------------------------------------------------------ bookkeeping
    def forget(self, req: Request) -> None:
        """Drop a request's draft state (finish, abort, retraction); its state row is free again."""
        self.rows.release(req)
        self.lag.forget(req)
        self.acceptance.pop(req, None)

    @property
    def num_compiles(self) -> dict[str, int]:
        variants = [self._fns(r) for r in (False, True)]
        counts = {"step": self.runner.num_compiles,
                  "prefill": sum(f[0].num_compiles + f[-1].num_compiles for f in variants)}
        names = ("chain_round", "draft_chain", "verify_chain"), ("tree_round", "tree_draft", "tree_verify")
        used, unused = names[::-1] if self.topk > 1 else names
        counts.update({name: sum(f[i].num_compiles for f in variants) for i, name in enumerate(used, 1)})
        counts.update(dict.fromkeys(unused, 0))
        counts.update(plain_capture=self._lazy[0].num_compiles, catch_up=self._lazy[1].num_compiles)
        return counts

    def warm_plan(self) -> list[tuple[Programs, Bucket, tuple]]:
        """(programs, bucket, abstract arguments) of the programs this stepper's steps can use, ordered by
        `runner.largest_first`: the prefill program per (tokens, seqs, pages) with seqs <= tokens, and
        unless the policy always drafts, the deferred plain decode step per (seqs, pages) and its catch-up
        per (seqs, pages) at `AUX_RING` tokens per sequence; unless the policy never drafts, the round
        program (chain or tree) per (seqs, pages). The `record_draft_top1` variants are not planned, nor a
        constrained round's two halves (compiled when a grammar first runs)."""
        prefill, round_program = self._fns(False)[:2]
        state = (self.tparams, self.dparams, self.kv.pools, self.dpool, self.runner.penalties, self.states)
        num_rows = self.states[0].shape[0]
        b = self.buckets
        shapes = sorted(((t, s, p) for t in b.tokens for s in b.seqs for p in b.pages if s <= t),
                        key=lambda shape: -math.prod(shape))
        plan = []
        for t, s, p in shapes:
            inp = padding_step_input(self.kv, t, s, p)
            plan.append((prefill, (t, s, p), (
                *state, self.emb, self.last_tokens, inp.prev_rows, inp.input_ids, np.zeros(t, np.int32),
                np.full(t, -1, np.int32), inp.meta, inp.sampling, np.full(s, num_rows, np.int32))))
        if self.policy != "always":  # plain decode steps (one token per sequence) and their catch-ups
            plain_capture, catch_up = self._lazy
            for s, p in itertools.product(b.seqs, b.pages):
                t = pick_bucket(s, b.tokens, "num_tokens")
                inp = padding_step_input(self.kv, t, s, p)
                plan.append((plain_capture, (t, s, p), (
                    self.tparams, self.kv.pools, self.runner.penalties, self.aux_ring, self.last_tokens,
                    inp.prev_rows, inp.input_ids, inp.meta, inp.sampling, np.full(s, num_rows, np.int32))))
            for s, p in itertools.product(self.seq_buckets, self.page_buckets):
                t = s * AUX_RING
                meta = dataclasses.replace(padding_step_input(self.kv, t, s, p).meta, swa_write_slots=None,
                                           swa_page_table=None)
                plan.append((catch_up, (t, s, p), (
                    self.dparams, self.dpool, self.states, self.emb, self.aux_ring, np.zeros(t, np.int32),
                    meta, np.full(s, num_rows, np.int32))))
        if self.policy == "never":
            return largest_first(plan)
        nv = self.num_verify
        for s, p in sorted(((s, p) for s in self.seq_buckets for p in self.page_buckets),
                           key=lambda shape: -math.prod(shape)):
            meta = padding_step_input(self.kv, s * nv, s, p).meta
            draft_metas = None
            if self.num_steps > 1:
                one = dataclasses.replace(padding_step_input(self.kv, s * self.topk, s, p).meta,
                                          swa_write_slots=None, swa_page_table=None)
                draft_metas = jax.tree.map(lambda x: np.stack([x] * (self.num_steps - 1)), one)
            zeros = np.zeros(s, np.int32)
            plan.append((round_program, (s, p), (
                *state, self.shifts, self.emb, zeros, np.full(s, num_rows, np.int32), np.zeros(s, bool),
                zeros, draft_metas, meta, build_sampling_batch([], s * nv))))
        return largest_first(plan)

    @property
    def acc_length(self) -> float:
        """Pooled tokens per verify round so far (accepted drafts + 1)."""
        rounds = self.stats["rounds"]
        return (self.stats["accepted"] + rounds) / rounds if rounds else 0.0


def _wants_top(reqs) -> bool:
    """Whether any of `reqs` reports top logprobs (the step's top arrays are then read back)."""
    return any(req.params.top_logprobs_num for req in reqs)
