"""`Engine`: the offline API (SGLang's `Engine.generate` shape) and the step API for a user's own loop.

    engine = Engine(model_path="/ckpt", page_size=16, chunked_prefill_size=256)
    out = engine.generate("Hello", {"temperature": 0, "max_new_tokens": 16})
    out["text"], out["output_ids"], out["meta_info"]["cached_tokens"]

Low level (a plain Python loop over the same machinery): `rid = engine.submit(input_ids=[...])`, then
`while not engine.idle: for req in engine.step(): ...` (each `step` schedules one ragged batch, runs the
jitted forward + sampling on device, applies the results and returns the requests that finished);
`engine.abort(rid)`, `engine.flush_cache()`, `engine.check_memory()`. `engine.kv` (pools, allocator, tree),
`engine.scheduler`, `engine.runner` and `engine.stepper` (a `jaxserve.engine.stepper.Stepper`: plain, or
EAGLE-3 from `jaxserve.speculative`) are the parts, documented in their modules. This module is the facade
above both packages: `engine/` never imports `speculative/`.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from jaxserve.engine import multihost
from jaxserve.engine.config import ServerArgs
from jaxserve.engine.errors import (
    EngineBusyError,
    InvalidRequestError,
    UnknownRequestError,
)
from jaxserve.engine.inputs import (
    InputIds,
    ParamsArg,
    Prompt,
    normalise_params,
    normalise_prompts,
    prepare_request,
)
from jaxserve.engine.kv_cache import KVCache
from jaxserve.engine.loading import eos_token_ids, load_model_and_tokenizer
from jaxserve.engine.memory_plan import (
    MemoryPlan,
    activation_peak_bytes,
    device_memory,
    plan_kv_pools,
    weight_bytes_per_device,
)
from jaxserve.engine.request import Request, Status, make_request
from jaxserve.engine.runner import ModelRunner, enable_background_compiles
from jaxserve.engine.step_input import Buckets
from jaxserve.engine.stepper import PlainStepper, Stepper
from jaxserve.models.decoder import CausalLM, scan_layers
from jaxserve.models.sharding import make_tp_mesh, shard_model, tp_layout
from jaxserve.sampling import SamplingParams, SeedSource
from jaxserve.sampling.grammar import ConstraintBackend, make_grammar_backend
from jaxserve.speculative.loading import load_draft
from jaxserve.speculative.stepper import EagleStepper


class Engine:
    """One model, one KV pool, one scheduler, in this process. Not thread-safe: call it from one thread.

    `Engine(model_path=..., **server_args)` loads a checkpoint; `Engine(model=..., tokenizer=..., ...)`
    serves an already built `CausalLM` (tokenizer optional: without one, pass input_ids and get ids back).
    Server args are `ServerArgs` fields (SGLang names). `buckets` (advanced) replaces the default
    power-of-two shape buckets, e.g. fewer shapes for fewer compilations.
    """

    def __init__(self, model_path: str | None = None, *, model: CausalLM | None = None, tokenizer=None,
                 buckets: Buckets | None = None, draft_model=None, **server_args: Any) -> None:
        self.args = ServerArgs.from_kwargs({"model_path": model_path, **server_args})
        speculative = self.args.speculative_algorithm is not None
        if speculative and draft_model is None:
            draft_model = load_draft(self.args)
        self.multihost = self.args.nnodes > 1
        if self.multihost:  # before any device work: every process joins, the mesh spans all of them
            multihost.initialize(self.args.dist_init_addr, self.args.nnodes, self.args.node_rank)
            multihost.check_mesh_covers_processes(self.args.tp_size)
            enable_background_compiles(False)  # a padded fallback on one process only would desync them
        self.mesh = make_tp_mesh(self.args.tp_size) if self.args.tp_size > 1 else None
        if model is None:
            aux_ids = tuple(draft_model.config.aux_layer_ids) if speculative else ()
            model, tokenizer = load_model_and_tokenizer(self.args, aux_hidden_state_layer_ids=aux_ids,
                                                        mesh=self.mesh)
        elif self.mesh is not None:
            model = shard_model(model, self.mesh, self.args.ep_size)  # in place: the caller's model too
        if not self.args.disable_layer_scan:
            model = scan_layers(model)  # a model loaded here is dropped: only the stacked layers stay
        self.model, self.tokenizer = model, tokenizer
        config = model.config
        self.vocab_size = int(config.vocab_size)
        self.context_length = int(self.args.context_length or config.max_position_embeddings or 4096)
        self.eos_token_ids = eos_token_ids(config.raw, tokenizer)
        args = self.args
        extra = 0  # a speculative round runs past the last position (verify span or tree draft scratch)
        if speculative:
            extra = max(args.num_draft_tokens, (args.speculative_num_steps - 1) * args.speculative_eagle_topk)
        context_pages = -(-(self.context_length + extra) // args.page_size)
        swa_pages = max(1, int(args.num_pages * args.swa_full_tokens_ratio))
        self.memory_plan: MemoryPlan | None = None
        if args.mem_fraction_static is not None and "max_total_tokens" not in server_args:
            self.memory_plan = self._plan_memory(context_pages)
            args = self.args = dataclasses.replace(args, max_total_tokens=self.memory_plan.max_total_tokens)
            swa_pages = self.memory_plan.swa_num_pages or swa_pages
            print(self.memory_plan.describe(), flush=True)
        self.kv = KVCache(config, num_pages=args.num_pages, page_size=args.page_size,
                          kv_dtype=config.jnp_dtype, disable_radix_cache=args.disable_radix_cache,
                          swa_num_pages=swa_pages, eagle=speculative and not args.debug_token_keys,
                          mesh=self.mesh)
        max_pages = min(context_pages, args.num_pages)
        self.buckets = buckets or Buckets.for_limits(max_tokens=args.chunked_prefill_size,
                                                     max_seqs=args.max_running_requests, max_pages=max_pages,
                                                     page_size=args.page_size)
        self.buckets.check_covers(max_tokens=args.chunked_prefill_size, max_seqs=args.max_running_requests,
                                  max_pages=max_pages)
        self.runner = ModelRunner(model, self.kv, self.buckets, args.max_running_requests)
        if self.multihost and self.is_leader:
            self.runner.broadcaster = multihost.Broadcaster()
        sizes = dict(max_tokens=args.chunked_prefill_size, max_running=args.max_running_requests)
        overlap = not args.disable_overlap_schedule
        self.stepper: Stepper
        if speculative:
            self.stepper = EagleStepper(model, draft_model, self.kv, self.buckets, runner=self.runner,
                                        num_steps=args.speculative_num_steps,
                                        topk=args.speculative_eagle_topk,
                                        num_draft_tokens=args.num_draft_tokens, overlap=overlap,
                                        context_length=self.context_length,
                                        policy=args.speculative_policy,
                                        disable_batch_size=args.speculative_disable_batch_size, **sizes)
        else:
            self.stepper = PlainStepper(self.kv, self.runner, self.buckets, overlap=overlap, **sizes)
        self.scheduler = self.stepper.scheduler
        self._seeds = SeedSource(args.random_seed)
        self.grammar: ConstraintBackend | None = None  # constrained decoding (json_schema / regex / ebnf)
        if tokenizer is not None:
            self.grammar = make_grammar_backend(args.grammar_backend, tokenizer.to_json(), self.vocab_size,
                                                self.eos_token_ids)
        self._requests: dict[str, Request] = {}
        self._ids = itertools.count()
        if args.warmup:
            self.runner.warmup()

    def _plan_memory(self, context_pages: int) -> MemoryPlan:
        """The KV pool sizes `mem_fraction_static` allows on the first device, with the forward's activation
        peak measured at the largest bucket (chunked_prefill_size tokens, max_running_requests sequences,
        a whole context of pages each)."""
        args, model = self.args, self.model
        kv_dtype = model.config.jnp_dtype
        layout = per_device = model.kv_layout
        if self.mesh is not None:  # the plan is per device: each holds 1/tp of the (kv-replicated) heads
            tp = self.mesh.shape["tp"]
            layout = tp_layout(layout, tp)
            per_device = dataclasses.replace(layout, num_kv_heads=layout.num_kv_heads // tp)
        activation = activation_peak_bytes(model, layout, num_tokens=args.chunked_prefill_size,
                                           num_seqs=args.max_running_requests, num_pages=context_pages,
                                           page_size=args.page_size, kv_dtype=kv_dtype, mesh=self.mesh)
        total, free = device_memory()
        return plan_kv_pools(per_device, fraction=args.mem_fraction_static, device_bytes=total,
                             free_bytes=free, weight_bytes=weight_bytes_per_device(model),
                             activation_bytes=activation, page_size=args.page_size, kv_dtype=kv_dtype,
                             swa_full_tokens_ratio=args.swa_full_tokens_ratio)

    # ------------------------------------------------------------------ multi-host
    @property
    def is_leader(self) -> bool:
        """Whether this process schedules: always single-process, rank 0 of a multi-host group."""
        return self.args.node_rank == 0

    def follow(self) -> int:
        """On a follower rank: run the leader's device operations until it stops the group
        (`shutdown`); returns how many ran. Raises RuntimeError on the leader or a single process."""
        if not self.multihost or self.is_leader:
            raise RuntimeError("Engine.follow runs on the ranks > 0 of a multi-host group only")
        return multihost.follow(self.runner)

    def shutdown(self) -> None:
        """On the multi-host leader: end the followers' loops (no step can run after this). Nothing to do
        on a single process. Also runs at interpreter exit."""
        if self.runner.broadcaster is not None:
            self.runner.broadcaster.stop()

    # ------------------------------------------------------------------ requests
    def submit(self, prompt: str | None = None, *, input_ids=None,
               sampling_params: SamplingParams | dict | None = None, rid: str | None = None) -> str:
        """Validate and queue one request; returns its id. Raises InvalidRequestError (or a subclass:
        PromptTooLongError, RequestTooLargeError) / InvalidSamplingParamsError with nothing queued."""
        items, _ = normalise_prompts(prompt, input_ids)
        params = normalise_params(sampling_params, 1, self.vocab_size)[0]
        if rid is not None and rid in self._requests and not self._requests[rid].finished:
            raise InvalidRequestError(f"request id {rid!r} is already live")
        return self._enqueue(*self._prepare(items[0], params, 0), rid)

    def _prepare(self, item: str | list[int], params: SamplingParams, index: int) -> tuple[np.ndarray,
                                                                                           SamplingParams]:
        ids, params = prepare_request(item, params, index, tokenizer=self.tokenizer,
                                      vocab_size=self.vocab_size, context_length=self.context_length,
                                      kv=self.kv)
        if params.grammar is not None:
            if self.multihost:  # its split step (engine.split_step) runs outside the mirrored runner calls
                raise InvalidRequestError(f"request {index}: constrained decoding with nnodes > 1 is not "
                                          f"supported yet")
            if self.grammar is None:
                raise InvalidRequestError(f"request {index}: {params.grammar[0]} needs a grammar backend "
                                          f"(--grammar-backend llguidance or xgrammar) and a tokenizer")
            self.grammar.compile(*params.grammar)  # a bad grammar is a 400 here, before anything is queued
        return ids, params

    def _enqueue(self, ids: np.ndarray, params: SamplingParams, rid: str | None) -> str:
        rid = rid if rid is not None else f"req-{next(self._ids)}"
        skip = params.skip_special_tokens
        detok = (lambda t: self.tokenizer.decode(list(t), skip_special_tokens=skip)) if self.tokenizer \
            else None
        req = make_request(rid, ids, params, tree_root=self.kv.tree.root, seed=self._seeds.seed_for(params),
                           eos_token_ids=self.eos_token_ids, detokenize=detok)
        if params.grammar is not None:
            req.grammar = self.grammar.matcher(*params.grammar)
        self._requests[rid] = req
        if req.stop.finished:  # max_new_tokens == 0: nothing to compute
            req.status, req.finish_time = Status.FINISHED, time.perf_counter()
        else:
            self.scheduler.add(req)
        return rid

    def abort(self, rid: str) -> None:
        """Stop a request wherever it is (queued, mid-prefill, mid-decode); its private KV is freed now."""
        req = self.request(rid)
        self.scheduler.abort(req)
        self.stepper.forget(req)

    def forget(self, rid: str) -> None:
        """Drop a finished or aborted request's record (its output); raises InvalidRequestError if live."""
        if not self.request(rid).finished:
            raise InvalidRequestError(f"request {rid!r} is still live; abort it first")
        del self._requests[rid]

    def request(self, rid: str) -> Request:
        try:
            return self._requests[rid]
        except KeyError:
            raise UnknownRequestError(f"no request with id {rid!r}") from None

    @property
    def idle(self) -> bool:
        """No request queued or running and no step in flight."""
        return self.stepper.idle

    @property
    def stats(self) -> dict:
        """The stepper's counters (`steps` dispatched, and per-stepper timings or speculative counts)."""
        return self.stepper.stats

    @property
    def num_compiles(self) -> dict[str, int]:
        """Executables compiled so far, per jitted program of the stepper."""
        return self.stepper.num_compiles

    # ------------------------------------------------------------------ stepping
    def step(self) -> list[Request]:
        """One step of the stepper: schedule, dispatch and apply results (the plain stepper applies the
        previous step's under the overlap schedule). Returns the requests that finished ([] when idle)."""
        return self.stepper.step()

    def run_until_idle(self) -> None:
        while not self.idle:
            self.step()

    def output(self, rid: str) -> dict:
        """text, output_ids and meta_info of a request (partial while it runs)."""
        req = self.request(rid)
        return {"text": req.stop.text, "output_ids": list(req.output_ids), "meta_info": req.meta_info()}

    # ------------------------------------------------------------------ offline API
    def generate(self, prompt: Prompt = None, sampling_params: ParamsArg = None, input_ids: InputIds = None,
                 stream: bool = False) -> dict | list[dict] | Iterator[dict]:
        """SGLang's offline `Engine.generate`: one prompt -> one dict, a list -> a list of dicts, each with
        `text`, `output_ids`, `meta_info` (prompt_tokens, completion_tokens, cached_tokens, finish_reason,
        e2e_latency). `stream=True` returns an iterator of incremental chunks (see `_stream`). Every request
        is validated before any is queued."""
        items, is_batch = normalise_prompts(prompt, input_ids)
        params = normalise_params(sampling_params, len(items), self.vocab_size)
        prepared = [self._prepare(item, p, i) for i, (item, p) in enumerate(zip(items, params, strict=True))]
        rids = [self._enqueue(ids, p, None) for ids, p in prepared]
        if stream:
            return self._stream(rids, is_batch)
        while not all(self._requests[r].finished for r in rids):
            self.step()
        if self.scheduler.idle:
            self.run_until_idle()  # apply the step still in flight (tokens after a stop, discarded)
        outs = [self.output(r) for r in rids]
        for rid in rids:  # returned to the caller: the engine keeps no record (submit/step users call forget)
            self.forget(rid)
        return outs if is_batch else outs[0]

    def _stream(self, rids: list[str], is_batch: bool) -> Iterator[dict]:
        """Yield `{"text": delta, "output_ids": new ids, "finished", "meta_info"}` (plus "index" for a batch)
        per request whenever it has something new; text held back while it may still become a stop string."""
        sent = dict.fromkeys(rids, 0)
        pending = set(rids)
        try:
            while pending:
                self.step()
                for i, rid in enumerate(rids):
                    req = self._requests[rid]
                    if rid not in pending or (len(req.output_ids) == sent[rid] and not req.finished):
                        continue
                    chunk = {"text": req.stop.stream_delta(), "output_ids": list(req.output_ids[sent[rid]:]),
                             "finished": req.finished, "meta_info": req.meta_info()}
                    sent[rid] = len(req.output_ids)
                    if req.finished:
                        pending.discard(rid)
                        self.forget(rid)
                    yield {**chunk, "index": i} if is_batch else chunk
        finally:  # the caller stopped iterating early (or an error): abort what is left, free its KV
            for rid in pending:
                self.abort(rid)
                self.forget(rid)
        if self.scheduler.idle:
            self.run_until_idle()

    # ------------------------------------------------------------------ memory
    def flush_cache(self) -> bool:
        """Drop the prefix tree (all cached KV back to the allocator). Only when idle: raises EngineBusyError
        otherwise. Returns True."""
        if self.scheduler.idle:
            self.run_until_idle()
        if not self.idle:
            raise EngineBusyError(f"flush_cache with {len(self.scheduler.running)} running and "
                                  f"{len(self.scheduler.waiting)} waiting requests; wait or abort them")
        self.kv.flush()
        return True

    def check_memory(self) -> dict[str, int]:
        """Prove slot ownership (free / tree / live requests partition the pool); returns the counts."""
        return self.kv.check([r.cached for r in self.scheduler.running])

    @property
    def num_prompt_tokens_computed(self) -> int:
        return self.scheduler.num_prompt_tokens_computed

