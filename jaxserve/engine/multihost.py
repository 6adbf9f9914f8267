"""Multi-host serving over `jax.distributed`: one SPMD step program across the devices of every process.

`--dist-init-addr HOST:PORT --nnodes N --node-rank R` (SGLang's flags, `ServerArgs` fields) start JAX's
multi-controller runtime (`initialize`): every process then sees the global device list and the engine's
`("tp",)` mesh spans all of them (`tp_size` must equal the global device count, so each process holds
shards). Every process builds the same engine from the same arguments, so the construction-time device
work (weights placed shard by shard, pools, penalty rows) is the same collective program everywhere.

After that, rank 0 is the leader: it runs the scheduler (and the HTTP server); the other ranks are
followers that run `follow(runner)`. Each device operation of the leader's `ModelRunner` (a step, a
prompt-logprobs step, a penalty row) is first announced to the followers with
`jax.experimental.multihost_utils.broadcast_one_to_all` - JAX's own collectives, no socket of ours: a
fixed-size header (operation code, payload length) and then the pickled host arguments as a byte array
padded to a power of two (so only a few broadcast shapes are ever compiled). The followers then call the
same runner method with the same arguments, and all processes execute the same compiled step, each on its
addressable shards. A stop operation ends the follower loop (`Broadcaster.stop`, sent once, also at
interpreter exit on the leader).

Rules that keep the processes in lock-step (a process that skips a collective hangs the others):
- steps never run padded to another bucket while theirs compiles (no background fallback: the leader and a
  follower could pick different executables);
- nothing else may touch the mesh on one process only (e.g. a cache snapshot restore, a memory plan from
  this process's own free memory): those are refused with nnodes > 1;
- the preemption service is off before `initialize`, so SIGTERM still stops a process.
If the leader dies, JAX's coordination service aborts the followers (it runs in the leader's process).
"""

from __future__ import annotations

import atexit
import pickle
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

OP_STOP, OP_STEP, OP_PROMPT_STEP, OP_PENALTY_ROW = 0, 1, 2, 3
_MIN_PAYLOAD = 1024

_initialized: tuple[str, int, int] | None = None
_lock = threading.Lock()


def parse_addr(addr: str) -> tuple[str, int]:
    """`HOST:PORT` -> (host, port); ValueError naming the flag otherwise."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"dist_init_addr={addr!r}: expected HOST:PORT (e.g. 10.0.0.1:5000)")
    return host, int(port)


def initialize(dist_init_addr: str, nnodes: int, node_rank: int, *, local_device_count: int | None = None,
               timeout_s: int = 300) -> None:
    """Join the `nnodes`-process JAX runtime whose coordinator (rank 0's process) listens at
    `dist_init_addr`. Must run before any other JAX computation in the process; a second call with the same
    arguments does nothing. On CPU, gloo carries the cross-process collectives, and `local_device_count`
    (when given) sets this process's number of CPU devices. Blocks until every process has joined (up to
    `timeout_s`)."""
    global _initialized
    import jax

    key = (dist_init_addr, nnodes, node_rank)
    with _lock:
        if _initialized is not None:
            if _initialized != key:
                raise RuntimeError(f"jax.distributed is already initialized as {_initialized}, not {key}")
            return
        parse_addr(dist_init_addr)
        # with the preemption notifier on, XLA keeps SIGTERM for itself and the process never stops
        jax.config.update("jax_enable_preemption_service", False)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        if local_device_count is not None:
            jax.config.update("jax_num_cpu_devices", local_device_count)
        jax.distributed.initialize(coordinator_address=dist_init_addr, num_processes=nnodes,
                                   process_id=node_rank, initialization_timeout=timeout_s)
        _initialized = key


def check_mesh_covers_processes(tp_size: int) -> None:
    """ValueError unless the `tp_size` mesh uses every process's devices (a process with no shard could
    not run the step)."""
    import jax

    if tp_size != jax.device_count():
        raise ValueError(f"multi-host serving needs tp_size equal to the global device count "
                         f"({jax.device_count()} over {jax.process_count()} processes, "
                         f"{jax.local_device_count()} here); got tp_size={tp_size}")


def _broadcast(value: np.ndarray, is_source: bool) -> np.ndarray:
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.broadcast_one_to_all(value, is_source=is_source))


def _payload_size(n: int) -> int:
    size = _MIN_PAYLOAD
    while size < n:
        size *= 2
    return size


class Broadcaster:
    """The leader's side: `send(op, args)` announces one runner operation to every follower (blocks until
    they have it); `stop()` ends their loops (once; also at interpreter exit)."""

    def __init__(self) -> None:
        self.stopped = False
        self.num_sent = 0
        atexit.register(self.stop)

    def send(self, op: int, args: Any = None) -> None:
        if self.stopped:
            raise RuntimeError("the followers were stopped; no more steps can run")
        data = np.frombuffer(pickle.dumps(args, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
        size = _payload_size(data.size)
        _broadcast(np.array([op, data.size, size], np.int64), True)
        _broadcast(np.pad(data, (0, size - data.size)), True)
        self.num_sent += 1

    def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            _broadcast(np.array([OP_STOP, 0, 0], np.int64), True)


def receive() -> tuple[int, Any]:
    """The follower's side of `Broadcaster.send`: (operation code, its arguments)."""
    op, n, size = (int(x) for x in _broadcast(np.zeros(3, np.int64), False))
    if op == OP_STOP:
        return op, None
    data = _broadcast(np.zeros(size, np.uint8), False)
    return op, pickle.loads(data[:n].tobytes())


def follow(runner, *, on_op: Callable[[int], None] | None = None) -> int:
    """Run the leader's runner operations on this process's `runner` until a stop arrives; returns the
    number of operations run. Results stay on device (only the leader reads sampled tokens)."""
    ops = {OP_STEP: lambda a: runner.run(*a), OP_PROMPT_STEP: lambda a: runner.run_with_prompt_logprobs(*a),
           OP_PENALTY_ROW: lambda a: runner.set_penalty_row(*a)}
    count = 0
    while True:
        op, args = receive()
        if on_op is not None:
            on_op(op)
        if op == OP_STOP:
            return count
        if op not in ops:
            raise RuntimeError(f"follower: unknown operation {op} from the leader")
        ops[op](args)
        count += 1


def to_local(tree: Any) -> Any:
    """Each array of `tree` as its first addressable shard: a replicated result of a step over a mesh that
    spans processes cannot be read with `np.asarray`, its local copy can (still without waiting)."""
    import jax

    return jax.tree.map(lambda x: x if x.is_fully_addressable else x.addressable_data(0), tree)
