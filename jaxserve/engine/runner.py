"""`ModelRunner`: the jitted device step (forward + on-device sampling) and the device state it carries.

One step = `step(params, kv_pools, penalties, inp) -> (kv_pools, penalties, SampleOutput)`: the model writes
this step's K/V into the donated pools and attends through the page tables, then `jaxserve.sampling.sample`
draws one token per sequence row in the same executable, so only `S` token ids and `S` logprobs come back
to the host. The penalty pool (token counts for repetition/frequency/presence penalties, one row per running
request) is donated too. Dispatch is asynchronous: `run` returns device arrays at once; reading them
(`np.asarray`) waits for the step.

Compiles never stall a step that fits a compiled program (`Programs`): every jitted step function is
compiled ahead of time per bucket shape. A step whose exact bucket has no executable yet runs padded to the
smallest compiled bucket that holds it (padding tokens write only the reserved slot 0, padding rows are
greedy padding rows, as `build_step_input` pads) while the exact bucket compiles on a background thread;
only a step that no compiled bucket holds compiles on the spot. With the persistent compilation cache on,
both kinds of compile are loads on a restart. A padded step computes the same function on every real row,
but not always the same bits: XLA's CPU kernels are chosen per shape, and a logprob can differ from the
exact bucket's in its last bit (about 1e-6), which a near tie could turn into another greedy token.

Running padded while compiling in the background is a process-wide choice, off unless
`enable_background_compiles()` is called (the server does; a library `Engine` compiles each bucket on the
calling thread, as `jax.jit` would). Measured on jax 0.10.2 CPU: a compile on one thread while another
thread compiles or loads an executable from the persistent cache can crash the process (a segmentation
fault in the loader, or an abort while an exception unwinds), so every compile of `Programs` holds one
process-wide lock, and other jitted code should not compile while background compiles run.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import itertools
import math
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec
from tqdm import tqdm

from jaxserve.engine import multihost, split_step
from jaxserve.engine.kv_cache import KVCache
from jaxserve.engine.packed_args import ArgLayout
from jaxserve.engine.program_cache import MappingLimitError, check_mapping_headroom, program_factory
from jaxserve.engine.step_input import (
    Buckets,
    StepInput,
    pad_sampling,
    pad_step_input,
    padding_step_input,
    step_bucket,
)
from jaxserve.models.decoder import CausalLM
from jaxserve.sampling import (
    PenaltyPool,
    SampleOutput,
    SamplingBatch,
    new_penalty_pool,
    sample,
    update_counts,
)
from jaxserve.sampling.logprobs import next_token_logprobs

Bucket = tuple[int, ...]
Repad = Callable[[tuple, Bucket], tuple]  # (a call's arguments, a larger bucket) -> those arguments padded


def spec(x: Any) -> jax.ShapeDtypeStruct:
    """The abstract value an argument leaf is lowered as (a device array keeps its sharding)."""
    if isinstance(x, jax.Array):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding, weak_type=x.weak_type)
    if isinstance(x, jax.ShapeDtypeStruct):
        return x
    x = np.asarray(x)
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


def _arg_signature(arg: Any) -> tuple:
    """One argument's part of a signature, with its leaves: `(pytree structure, per-leaf (shape, dtype,
    weak type, sharding), leaves)` (host arrays: sharding None)."""
    leaves, tree = jax.tree.flatten(arg)
    return tree, tuple(_leaf_signature(x) for x in leaves), tuple(leaves)


def _leaf_signature(x: Any) -> tuple:
    if isinstance(x, np.ndarray):  # the common host leaf, without the attribute misses below
        return x.shape, x.dtype, False, None
    return x.shape, np.dtype(x.dtype), getattr(x, "weak_type", False), getattr(x, "sharding", None)


def _parts(args: tuple, known: dict[int, tuple] | None = None) -> list[tuple]:
    """`_arg_signature` of every argument; `known` maps argument positions to parts already computed."""
    return [(known or {}).get(i) or _arg_signature(a) for i, a in enumerate(args)]


def _signature(parts: list[tuple]) -> tuple:
    """What selects an executable: `(structures, leaves)`, each a tuple over the arguments (from `_parts`)."""
    return tuple(p[0] for p in parts), tuple(p[1] for p in parts)


_COMPILE_LOCK = threading.Lock()  # one XLA compile (or persistent-cache load) at a time, process-wide
_BACKGROUND = threading.Event()  # set: steps may run padded while their exact bucket compiles


def enable_background_compiles(enabled: bool = True) -> None:
    """Let steps run padded to a larger compiled bucket while theirs compiles on a background thread (see
    the module docstring); off by default. Affects every `Programs` of the process."""
    if enabled:
        _BACKGROUND.set()
    else:
        _BACKGROUND.clear()


@dataclasses.dataclass(eq=False)
class _Program:
    """One executable of a `Programs`: its bucket, the abstract arguments it is lowered from and its state
    (`queued`, `compiling`, `ready` or `failed`; `done` is set at the last two)."""

    bucket: Bucket
    specs: tuple
    state: str = "queued"
    compiled: Any = None
    layout: ArgLayout | None = None  # how a call's arguments reach `compiled` (set with it)
    error: BaseException | None = None
    done: threading.Event = dataclasses.field(default_factory=threading.Event)


class Programs:
    """Ahead-of-time executables of one jitted function, one per argument signature (pytree structure,
    shapes, dtypes, shardings), each tagged with the bucket (a tuple of padded sizes) its caller gives.

    `call(bucket, args, repad)` runs the executable of `args`' exact signature once it is compiled. Until
    then, when a compiled program of the same pytree structure has a bucket at least as large in every
    size, the call runs on the smallest such one (by product of sizes) with `repad(args, that_bucket)`,
    and the exact program is queued for the background thread; when none is large enough, the exact
    program is compiled on the calling thread (or waited for, if the background thread has started it).
    `repad` must give arguments that compute the exact bucket's function on every real row. Donation is the
    jitted function's (the AOT executable keeps it). Thread-safe; one daemon thread compiles queued
    programs in order, with the same persistent compilation cache as `jax.jit`.

    `fixed`: positions of arguments that callers replace but never change in place (model parameters,
    embedding tables). Each such object is walked once, when `call` first gets it there: its signature part
    and its leaves are kept while `call` gets the same object, and the executables take those leaves as a flat
    tuple (`fn` is wrapped to rebuild the pytree inside the trace). So a step neither re-walks the parameters
    for a signature nor has the dispatch flatten them again: an `nnx.State` flattens through a Python callback
    per variable (the embedded model's step: 37 variables; `ModelRunner.run` took 0.72 ms of host CPU per
    dispatch before this and 0.52 ms after, on a 2-core CPU), more for a large unscanned model. Mutating such
    an argument in place (e.g. assigning into an `nnx.State`) is outside the contract: the executables keep
    reading the leaves the object had when first seen; pass a new object instead.

    The numpy leaves of the other arguments reach an executable packed, one buffer per dtype
    (`packed_args.ArgLayout`), instead of one transfer each. `fn`'s donations carry over (read from its
    lowering: the first compile of each `Programs` traces `fn` once more); donated arguments are passed as
    they are, and fixed arguments must not be donated."""

    def __init__(self, fn: Any, name: str, fixed: tuple[int, ...] = ()) -> None:
        self.fn, self.name, self.fixed = fn, name, fixed
        # position -> (the object, its `_arg_signature`)
        self._fixed_parts: dict[int, tuple[Any, tuple]] = {}
        self._donated: tuple[int, ...] | None = None  # fn's donated argument positions, read at first compile
        self._programs: dict[tuple, _Program] = {}
        self._lock = threading.Lock()
        self._queue: queue.Queue[_Program] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._stopped = False
        self.num_padded = 0  # calls that ran padded to a larger compiled bucket
        _ALL_PROGRAMS.add(self)

    @property
    def num_compiles(self) -> int:
        """Programs requested so far (compiled, compiling or queued): at most one per signature."""
        return len(self._programs)

    def call(self, bucket: Bucket, args: tuple, repad: Repad) -> Any:
        """Run the function on `args` (shaped as `bucket`) through a compiled program (see the class)."""
        parts = _parts(args, self._known_parts(args))
        sig = _signature(parts)
        program = self._programs.get(sig)
        if program is not None and program.state == "ready":
            return program.compiled(*program.layout.pack(args, [p[2] for p in parts]))
        fallback = self._fallback(bucket, sig[0], args, repad) if _BACKGROUND.is_set() else None
        program = self._ensure(sig, bucket, args, queued=fallback is not None)
        if fallback is None:
            compiled = self._compiled_now(program)
            return compiled(*program.layout.pack(args, [p[2] for p in parts]))
        self.num_padded += 1
        big, padded, padded_parts = fallback
        return big.compiled(*big.layout.pack(padded, [p[2] for p in padded_parts]))

    def _known_parts(self, args: tuple) -> dict[int, tuple]:
        """`_arg_signature` of the `fixed` arguments, recomputed only for a new object at a position."""
        known = {}
        for i in self.fixed:
            held = self._fixed_parts.get(i)
            if held is None or held[0] is not args[i]:
                arg = args[i]
                held = self._fixed_parts[i] = (arg, _arg_signature(arg))
            known[i] = held[1]
        return known

    def _packed_fn(self, specs: tuple) -> tuple[Any, ArgLayout]:
        """`fn` jitted to take its arguments as `ArgLayout` packs them for arguments shaped as `specs`, with
        `fn`'s donations; and that layout."""
        if self._donated is None:
            info = self.fn.lower(*specs).args_info[0]
            self._donated = tuple(i for i, arg in enumerate(info)
                                  if any(leaf.donated for leaf in jax.tree.leaves(arg)))
            if set(self._donated) & set(self.fixed):
                raise ValueError(f"{self.name}: fixed arguments {self.fixed} must not be donated")
        layout = ArgLayout.of(specs, fixed=self.fixed, donated=self._donated)
        fn = self.fn

        @functools.wraps(fn)
        def packed(*flat):
            return fn(*layout.unpack(flat))

        return jax.jit(packed, donate_argnums=self._donated), layout

    def prepare(self, bucket: Bucket, args: tuple) -> threading.Event:
        """Queue the program of `args` (leaves may be `jax.ShapeDtypeStruct`) for the background thread
        unless it is known already; returns its event, set once it is compiled (or failed)."""
        return self._ensure(_signature(_parts(args)), bucket, args, queued=True).done

    def _ensure(self, sig: tuple, bucket: Bucket, args: tuple, *, queued: bool) -> _Program:
        with self._lock:
            program = self._programs.get(sig)
            if program is None:
                program = self._programs[sig] = _Program(bucket, jax.tree.map(spec, args))
                _count_requested()
                if queued:
                    self._queue.put(program)
                    if self._worker is None:
                        self._worker = threading.Thread(target=self._work, name=f"compile-{self.name}",
                                                        daemon=True)
                        self._worker.start()
            return program

    def _fallback(self, bucket: Bucket, tree: Any, args: tuple, repad: Repad
                  ) -> tuple[_Program, tuple, list[tuple]] | None:
        """(program, padded arguments, their `_parts`) of the smallest compiled bucket holding `bucket`, or
        None."""
        with self._lock:
            larger = sorted({p.bucket for s, p in self._programs.items()
                             if p.state == "ready" and s[0] == tree and p.bucket != bucket
                             and all(a >= b for a, b in zip(p.bucket, bucket, strict=True))},
                            key=lambda b: (math.prod(b), b))
        for big in larger:
            padded = repad(args, big)
            parts = _parts(padded, self._known_parts(padded))
            program = self._programs.get(_signature(parts))
            if program is not None and program.state == "ready":
                return program, padded, parts
        return None

    def _claim(self, program: _Program, *, retry_refused: bool = False) -> bool:
        """Mark a queued program (or, `retry_refused`, one refused for lack of memory mappings) as being
        compiled by the caller; False when another thread has it or it has ended."""
        with self._lock:
            refused = program.state == "failed" and isinstance(program.error, MappingLimitError)
            if program.state != "queued" and not (retry_refused and refused):
                return False
            if refused:
                program.error = None
                program.done.clear()
            program.state = "compiling"
            return True

    def _compiled_now(self, program: _Program) -> Any:
        """The program's executable: compiled on this thread unless the background thread has started it
        (then waited for). Raises what its compile raised. A compile refused for lack of memory mappings is
        tried again here (other programs may have been released since); a step that can run padded does
        not come here, so a refused background compile is not retried at every step."""
        if self._claim(program, retry_refused=True):
            self._compile(program)
        program.done.wait()
        if program.error is not None:
            raise program.error
        return program.compiled

    def _compile(self, program: _Program) -> None:
        try:
            with _COMPILE_LOCK:
                check_mapping_headroom()  # on CPU, past the process's mapping limit XLA segfaults
                fn, layout = self._packed_fn(program.specs)
                program.compiled = fn.lower(*layout.flat_specs(program.specs)).compile()
                program.layout = layout
            program.state = "ready"
        except Exception as exc:  # re-raised by the call that needs this program (`_compiled_now`)
            program.error, program.state = exc, "failed"
        program.done.set()

    def _work(self) -> None:
        """Compile queued programs until the queue is empty (or `stop`), then end: `_ensure` starts a new
        thread for the next queued program, so idle engines keep no threads."""
        while True:
            with self._lock:
                if self._stopped or self._queue.empty():
                    self._worker = None
                    return
                program = self._queue.get_nowait()
            if self._claim(program):
                self._compile(program)

    def stop(self, timeout_s: float | None = None) -> bool:
        """Stop the background thread: queued programs stay queued (a call that needs one compiles it on
        its own thread); the compile in progress, if any, is waited for up to `timeout_s` seconds (None:
        until it ends). Returns whether the thread has ended."""
        with self._lock:
            self._stopped = True
            worker = self._worker
        if worker is not None:
            worker.join(timeout_s)
        return worker is None or not worker.is_alive()


_ALL_PROGRAMS: weakref.WeakSet[Programs] = weakref.WeakSet()
_REQUESTED = [0]  # programs requested by every `Programs` of the process (compiled, compiling or queued)
_REQUESTED_LOCK = threading.Lock()


def _count_requested() -> None:
    with _REQUESTED_LOCK:
        _REQUESTED[0] += 1


def programs_requested() -> int:
    """Programs requested so far by every `Programs` of the process: O(1), for a step that must know
    whether it compiled (or queued a compile) without summing its stepper's `num_compiles`."""
    return _REQUESTED[0]


def stop_background_compiles(timeout_s: float | None = None) -> bool:
    """`Programs.stop` for every `Programs` of the process, within `timeout_s` seconds in all (None: no
    limit). Returns whether no compile is still running. Runs at interpreter exit: a compile thread killed
    mid-compile aborts the process."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    return all([programs.stop(None if deadline is None else max(0.0, deadline - time.monotonic()))
                for programs in list(_ALL_PROGRAMS)])


atexit.register(stop_background_compiles)


def largest_first(plan: list[tuple[Programs, Bucket, tuple]]) -> list[tuple[Programs, Bucket, tuple]]:
    """`plan` (largest first per program) with abstract arguments, reordered: first the largest bucket of
    each program (it holds every other step, so once it is compiled no step waits for a compile), then
    the others from the smallest up (short requests' shapes are the common ones)."""
    heads: dict[Programs, int] = {}
    for i, (programs, _, _) in enumerate(plan):
        heads.setdefault(programs, i)
    first = sorted(heads.values(), key=lambda i: math.prod(plan[i][1]))
    rest = sorted(set(range(len(plan))) - set(first), key=lambda i: math.prod(plan[i][1]))
    return [(p, b, jax.tree.map(spec, a)) for p, b, a in (plan[i] for i in [*first, *rest])]


@program_factory(maxsize=8)
def _make_step(graphdef, max_seqs: int, prompt_logprobs: bool = False) -> Programs:
    """The step programs for one model graph; cached so that engines over the same model share executables.
    `prev_tokens` i32[max_seqs] are the previous step's sampled ids (padded), the source of pending tokens;
    the step returns its own ids padded the same way for the next step. `prompt_logprobs`: the variant that
    computes logits at every position and also returns, for `next_ids i32[T]`, each token's raw logprob of
    its next id and the top ones (see `engine.prompt_logprobs`)."""

    @functools.partial(jax.jit, donate_argnames=("kv_pools", "penalties"))
    def step(params, kv_pools, penalties: PenaltyPool, prev_tokens: jax.Array, inp: StepInput, next_ids=None):
        model = nnx.merge(graphdef, params)
        input_ids = jnp.where(inp.prev_rows >= 0, prev_tokens[jnp.maximum(inp.prev_rows, 0)], inp.input_ids)
        logits, kv_pools, _ = model(input_ids, inp.meta, kv_pools, return_all_logits=prompt_logprobs)
        every = logits
        if prompt_logprobs:
            logits = every[inp.meta.sample_idx]
        out = sample(logits, inp.sampling, penalties)
        penalties = update_counts(penalties, inp.sampling.penalty_rows, out.token_ids)
        next_tokens = jnp.zeros(max_seqs, jnp.int32).at[: out.token_ids.shape[0]].set(out.token_ids)
        if not prompt_logprobs:
            return kv_pools, penalties, next_tokens, out
        return kv_pools, penalties, next_tokens, (out, next_token_logprobs(every, next_ids))

    return Programs(step, "prompt_step" if prompt_logprobs else "step", fixed=(0,))


@program_factory(maxsize=8)
def _make_split(graphdef, max_seqs: int) -> tuple[Programs, Programs]:
    """The (forward, sample) programs of `engine.split_step` for one model graph (cached as `_make_step`)."""
    forward, sample_step = split_step.split_fns(graphdef, max_seqs)
    return Programs(forward, "split_forward", fixed=(0,)), Programs(sample_step, "split_sample")


def _repad_step(args: tuple, bucket: Bucket) -> tuple:
    """The step's arguments with the StepInput (and the prompt logprobs' next ids) padded to `bucket`."""
    t = bucket[0]
    extra = () if len(args) == 5 else (np.pad(np.asarray(args[5]), (0, t - args[5].shape[0])),)
    return (*args[:4], pad_step_input(args[4], *bucket), *extra)


@functools.partial(jax.jit, donate_argnames=("penalties",))
def _set_penalty_row(penalties: PenaltyPool, row, prompt_mask, counts) -> PenaltyPool:
    return PenaltyPool(penalties.output_counts.at[row].set(counts),
                       penalties.prompt_mask.at[row].set(prompt_mask))


class ModelRunner:
    """Owns the split model parameters, the jitted step and the penalty pool; steps `kv.pools` in place
    (the pools are donated and replaced by the step's outputs)."""

    def __init__(self, model: CausalLM, kv: KVCache, buckets: Buckets, num_penalty_rows: int) -> None:
        graphdef, self.params = nnx.split(model)
        self.graphdef = graphdef  # the model's structure (the programs merge it with `params`)
        # multi-host leader (`engine.multihost`): announces each device operation to the followers first
        self.broadcaster = None
        self.kv = kv
        self.buckets = buckets
        self.vocab_size = int(model.config.vocab_size)
        self.penalties = new_penalty_pool(num_penalty_rows, self.vocab_size)
        max_seqs = max(buckets.seqs)
        self._step = _make_step(graphdef, max_seqs)
        self._prompt_step = _make_step(graphdef, max_seqs, prompt_logprobs=True)
        self._last_tokens = jnp.zeros(max_seqs, jnp.int32)
        self._split: tuple[Programs, Programs] | None = None  # made at the first split step
        if kv.mesh is not None:  # tensor parallel: every step argument lives on the mesh (replicated)
            replicated = NamedSharding(kv.mesh, PartitionSpec())
            self.penalties, self._last_tokens = jax.device_put((self.penalties, self._last_tokens),
                                                               replicated)

    def run(self, inp: StepInput) -> SampleOutput:
        """Dispatch one step; returns the sampled ids/logprobs as device arrays (not yet waited for).
        Tokens marked in `inp.prev_rows` are read on device from the previously dispatched step's samples."""
        if self.broadcaster is not None:
            self.broadcaster.send(multihost.OP_STEP, (inp,))
        self.kv.pools, self.penalties, self._last_tokens, out = self._step.call(
            step_bucket(inp), (self.params, self.kv.pools, self.penalties, self._last_tokens, inp),
            _repad_step)
        return out if self.broadcaster is None else multihost.to_local(out)

    def run_with_prompt_logprobs(self, inp: StepInput, next_ids: np.ndarray) -> tuple[SampleOutput, tuple]:
        """`run` on the all-positions variant: also (logprobs f32[T] of `next_ids`, top ids i32[T, K], top
        logprobs f32[T, K]) as device arrays (see `engine.prompt_logprobs`)."""
        if self.broadcaster is not None:
            self.broadcaster.send(multihost.OP_PROMPT_STEP, (inp, next_ids))
        self.kv.pools, self.penalties, self._last_tokens, (out, prompt) = self._prompt_step.call(
            step_bucket(inp), (self.params, self.kv.pools, self.penalties, self._last_tokens, inp, next_ids),
            _repad_step)
        return (out, prompt) if self.broadcaster is None else multihost.to_local((out, prompt))

    def run_forward(self, inp: StepInput) -> jax.Array:
        """The first half of a split step (`engine.split_step`): dispatch the model over `inp` (its sampling
        rows are not read) and return the logits [S', V] (S' >= the input's rows when it ran padded to a
        larger bucket), not waited for. `run_sample` must follow before the next step."""
        if self.broadcaster is not None:
            raise RuntimeError("split steps run on one process only; a multi-host engine refuses grammars")
        if self._split is None:
            self._split = _make_split(self.graphdef, self._last_tokens.shape[0])
        self.kv.pools, logits = self._split[0].call(
            step_bucket(inp), (self.params, self.kv.pools, self._last_tokens, inp.input_ids, inp.prev_rows,
                               inp.meta), split_step.repad_forward)
        return logits

    def run_sample(self, logits: jax.Array, sampling: SamplingBatch) -> SampleOutput:
        """The second half: sample `run_forward`'s logits with `sampling` (its masks filled now), update the
        penalty counts and the previous samples as `run` does; returns the samples of `sampling`'s rows as
        device arrays."""
        rows = sampling.num_rows
        sampling = pad_sampling(sampling, logits.shape[0])
        self.penalties, self._last_tokens, out = self._split[1].call(
            (logits.shape[0],), (logits, sampling, self.penalties), split_step.repad_sample)
        if logits.shape[0] == rows:
            return out
        return SampleOutput(*(x[:rows] for x in (out.token_ids, out.logprobs, out.top_ids, out.top_logprobs)))

    def set_penalty_row(self, row: int, prompt_ids: np.ndarray, output_ids: list[int]) -> None:
        """Give penalty row `row` to a request: prompt tokens marked, output tokens counted (also after a
        retraction, so counts survive recomputation)."""
        if self.broadcaster is not None:
            self.broadcaster.send(multihost.OP_PENALTY_ROW, (row, prompt_ids, output_ids))
        mask = np.zeros(self.vocab_size, bool)
        mask[np.asarray(prompt_ids, np.int64)] = True
        counts = np.bincount(np.asarray(output_ids, np.int64), minlength=self.vocab_size).astype(np.int32)
        self.penalties = _set_penalty_row(self.penalties, jnp.int32(row), mask, counts)

    @property
    def num_compiles(self) -> int:
        """Distinct executables of the step requested so far (one per bucket shape used, and per shape used
        by a step with prompt logprobs; a shape that ran padded counts once its own program is queued)."""
        return self._step.num_compiles + self._prompt_step.num_compiles

    @property
    def num_split_compiles(self) -> int:
        """Executables of both halves of the split step requested so far (0 until the first split step)."""
        return 0 if self._split is None else self._split[0].num_compiles + self._split[1].num_compiles

    def warm_plan(self) -> list[tuple[Programs, Bucket, tuple]]:
        """(programs, bucket, arguments) of every plain-step bucket shape (seqs <= tokens), ordered by
        `largest_first`. Arguments are abstract (as all-padding inputs: they would write only the reserved
        slot 0)."""
        b = self.buckets
        shapes = sorted(((t, s, p) for t, s, p in itertools.product(b.tokens, b.seqs, b.pages) if s <= t),
                        key=lambda shape: -math.prod(shape))
        state = (self.params, self.kv.pools, self.penalties, self._last_tokens)
        return largest_first([(self._step, shape, (*state, padding_step_input(self.kv, *shape)))
                              for shape in shapes])

    def warmup(self, *, progress: bool = True) -> int:
        """Compile every bucket shape on the background compile thread and wait for them. Returns the number
        of shapes."""
        plan = self.warm_plan()
        events = [programs.prepare(bucket, args) for programs, bucket, args in plan]
        for event in tqdm(events, desc="compiling step buckets", unit="shape", disable=not progress):
            event.wait()
        return len(plan)
