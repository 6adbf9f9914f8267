"""The serving engine: scheduler (continuous batching, chunked prefill, radix reuse, retraction), model
runner (one jitted forward + sampling step over donated pools) and the plain stepper. The `Engine` facade
that joins them with speculative decoding lives one level up, in `jaxserve.api`.

Files: `config` (ServerArgs), `request` (Request, make_request), `kv_cache` (pools + allocator + prefix tree),
`scheduler` (admission, chunking, eviction, retraction, results), `step_input` (StepInput, buckets),
`runner` (the jitted step), `stepper` (the Stepper protocol and PlainStepper: one step with the overlap
schedule), `inputs`, `errors`.

Low-level loop for your own Flax NNX model. The model must follow `jaxserve.models.decoder`'s call contract,
`model(input_ids [T], meta: AttentionMetadata, kv_pools) -> (logits [S, vocab], new_kv_pools, aux)`, and carry
a `config: ModelConfig` (for the KV layout). Then, in a plain Python loop:

    kv = KVCache(model.config, num_pages=256, page_size=16, kv_dtype=jnp.float32, disable_radix_cache=False)
    buckets = Buckets.for_limits(max_tokens=256, max_seqs=8, max_pages=64)
    runner = ModelRunner(model, kv, buckets, num_penalty_rows=8)    # jitted forward + sampling, donated pools
    sched = Scheduler(kv, max_tokens=256, max_running=8, set_penalty_row=runner.set_penalty_row)
    sched.add(make_request("r0", prompt_ids, SamplingParams(temperature=0), tree_root=kv.tree.root, seed=0))
    while not sched.idle:
        batch = sched.schedule()                                     # admit, match prefixes, allocate slots
        out = runner.run(build_step_input(batch, kv, buckets))       # async: returns device arrays
        for req in sched.process(batch, np.asarray(out.token_ids), np.asarray(out.logprobs)):
            print(req.rid, req.output_ids)
    kv.check([]); kv.flush()                                         # prove ownership; drop the tree

`PlainStepper` is exactly this loop plus the overlap schedule; `jaxserve.api.Engine` adds validation,
tokenization and streaming.
"""

from jaxserve.engine.config import ServerArgs
from jaxserve.engine.errors import (
    EngineBusyError,
    EngineError,
    InvalidRequestError,
    PromptTooLongError,
    RequestTooLargeError,
    SchedulerStuckError,
    UnknownRequestError,
)

__all__ = [
    "EngineBusyError",
    "EngineError",
    "InvalidRequestError",
    "PromptTooLongError",
    "RequestTooLargeError",
    "SchedulerStuckError",
    "ServerArgs",
    "UnknownRequestError",
]
