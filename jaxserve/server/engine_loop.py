"""`EngineLoop`: one thread owns the (not thread-safe) `Engine`; asyncio handlers talk to it via a queue.

Commands (submit, abort, any `fn(engine)`) go into a `queue.Queue`; the thread runs them between steps and
answers through asyncio futures. After every `engine.step()` it first replaces `snapshot` (slot accounting,
running/waiting counts, and while nothing is live the ownership proof: what control-plane reads such as
/get_server_info return without waiting for the thread), then publishes, for each live request with new
tokens, one `Event` to that request's `asyncio.Queue` (via `loop.call_soon_threadsafe`). A finished or
aborted request gets a final event and is forgotten by the engine (no record is kept).

Logging (`server_log`): every `log_interval` busy steps one interval line; a step that waited on compilation
one compile-stall line; with `log_requests` one line per finished request.

Faults: a step that raises fails the requests it ran (their clients get a 500 naming the error), which are
aborted; the ownership proof runs again and the loop goes on serving the queue. `MAX_STEP_FAILURES` failed
steps in a row (or a broken proof) mean the engine itself is broken: every pending request fails and the
server answers 503 until restarted.

Ownership: a request's KV belongs to the engine until it finishes; `abort(rid)` (e.g. on client disconnect)
frees it at the next command drain. `stop()` aborts everything still live and joins the thread.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from jaxserve.api import Engine
from jaxserve.server import server_log
from jaxserve.server.compile_cache import CompileLog
from jaxserve.server.errors import APIError
from jaxserve.server.metrics import ServerMetrics, kv_usage
from jaxserve.server.warmup import Warmup

logger = logging.getLogger("jaxserve.server")
MAX_STEP_FAILURES = 3  # failed steps in a row after which the engine is declared dead (503 until restart)


@dataclasses.dataclass
class Event:
    """New output of one request: `delta_text` (stable text not sent before), `delta_ids` (new token ids);
    when `finished`, also the whole `text`, `output_ids` and the final `meta_info`."""

    delta_text: str
    delta_ids: list[int]
    finished: bool
    meta_info: dict[str, Any]
    text: str = ""
    output_ids: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Live:
    events: asyncio.Queue
    num_sent: int = 0


class EngineLoop:
    """Runs `engine` on a daemon thread. Coroutines must be awaited on the event loop given to `start`."""

    def __init__(self, engine: Engine, metrics: ServerMetrics, *, log_interval: int = 40,
                 log_requests: bool = False, compile_log: CompileLog | None = None,
                 warmup: Warmup | None = None) -> None:
        """`log_interval`: busy steps between interval lines (0: none); `compile_log`: the process's
        compile counter, for compile-stall lines (None: no such lines); `warmup`: its programs are queued for
        the background compile thread from this thread's first turn (`Warmup.advance`)."""
        self.engine = engine
        self.warmup = warmup
        self.metrics = metrics
        self.log_interval = log_interval
        self.log_requests = log_requests
        self.compile_log = compile_log
        self.num_finished = 0
        self.num_aborted = 0
        self.snapshot: dict[str, Any] = {}
        self._memory_stale = True  # something may have changed the pool since the last ownership proof
        self._busy_steps = 0
        self._step_failures = 0  # failed steps in a row
        self._commands: queue.Queue = queue.Queue()
        self._live: dict[str, _Live] = {}
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="jaxserve-engine", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.error: BaseException | None = None  # set if the loop died (the server then reports unhealthy)

    # ------------------------------------------------------------------ asyncio side
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Abort live requests and join the thread (it finishes its current step first)."""
        self._stopping.set()
        self._commands.put(None)
        self._thread.join(timeout_s)

    @property
    def healthy(self) -> bool:
        return self._thread.is_alive() and self.error is None

    async def call(self, fn: Callable[[Engine], Any]) -> Any:
        """Run `fn(engine)` on the engine thread between steps; return its result or raise its exception."""
        if not self.healthy:
            raise APIError(503, f"the engine is not running ({self.error!r}); restart the server")
        future = self._loop.create_future()
        self._commands.put((fn, future))
        return await future

    async def submit(self, prompts: Sequence[str] | None, input_ids: Sequence[Sequence[int]] | None,
                     params: Sequence[dict | None]) -> list[tuple[str, asyncio.Queue]]:
        """Queue a batch (all validated first: if one is invalid, none stays queued and its engine error is
        raised). Returns (rid, event queue) per request, in order."""
        items = list(prompts) if prompts is not None else list(input_ids)
        return await self.call(lambda engine: self._submit_all(engine, prompts is not None, items, params))

    def abort(self, rid: str) -> None:
        """Abort a live request (no-op once finished). Safe from any thread; does not wait."""
        self._commands.put((lambda engine: self._abort(engine, rid), None))

    async def abort_live(self, rid: str) -> bool:
        """Abort `rid` if it is live; returns whether it was (False: unknown or already finished)."""
        def abort(engine: Engine) -> bool:
            live = rid in self._live
            self._abort(engine, rid)
            return live

        return await self.call(abort)

    def abort_all(self) -> None:
        """Abort every live request (shutdown: open streams end with finish_reason abort at once instead of
        running until the graceful-shutdown timeout). Safe from any thread; does not wait."""
        self._commands.put((lambda engine: [self._abort(engine, rid) for rid in list(self._live)], None))

    # ------------------------------------------------------------------ engine thread
    def _submit_all(self, engine: Engine, is_text: bool, items: list, params: Sequence[dict | None]):
        rids: list[str] = []
        try:
            for item, p in zip(items, params, strict=True):
                kwargs = {"prompt": item} if is_text else {"input_ids": item}
                rids.append(engine.submit(**kwargs, sampling_params=p))
        except BaseException:
            for rid in rids:
                engine.abort(rid)
                engine.forget(rid)
            raise
        out = []
        for rid in rids:
            live = self._live[rid] = _Live(asyncio.Queue())
            out.append((rid, live.events))
            self.metrics.on_submit(engine.request(rid))
        self._publish(engine, rids)  # max_new_tokens == 0 finishes on submit
        return out

    def _abort(self, engine: Engine, rid: str) -> None:
        if rid not in self._live:
            return
        engine.abort(rid)
        self.metrics.on_abort()
        self.num_aborted += 1
        self._publish(engine, [rid])

    def _run(self) -> None:
        engine = self.engine
        try:
            self._take_snapshot(engine)
            while not self._stopping.is_set():
                self._drain(block=engine.idle)
                if self.warmup is not None and not self.warmup.finished:
                    self.warmup.advance(engine)
                self._take_snapshot(engine)  # commands (submit, abort) show before the step runs
                if not engine.idle:
                    try:
                        self._step(engine)
                    except Exception as exc:  # isolated in _fail_step, re-raised when it persists
                        self._fail_step(engine, exc)
                    self._take_snapshot(engine)
                    self._publish(engine, list(self._live))
        except Exception as exc:  # a bug: report it on every pending request, keep the process up (503s)
            self.error = exc
            logger.exception("the engine failed; the server now answers 503 until restarted")
            self._fail_all(exc)
        finally:
            if self.error is None:  # orderly stop: abort what is left (a failed engine is not touched)
                for rid in list(self._live):
                    self._abort(engine, rid)

    def _step(self, engine: Engine) -> None:
        """One engine step, logging a compile stall (a step that compiled) and, every `log_interval` busy
        steps, the interval line."""
        compiles = self._compiles()
        num_reqs = len(engine.scheduler.running) + len(engine.scheduler.waiting)
        t0 = time.perf_counter()
        engine.step()
        self._step_failures = 0
        self._memory_stale = True
        seconds = time.perf_counter() - t0
        new, hits = (a - b for a, b in zip(self._compiles(), compiles, strict=True))
        if new or hits:
            logger.info(server_log.compile_stall_line(num_reqs=num_reqs, seconds=seconds, num_compiles=new,
                                                      num_cache_hits=hits))
        self._busy_steps += 1
        if self.log_interval and self._busy_steps % self.log_interval == 0:
            self._log_interval(engine)

    def _fail_step(self, engine: Engine, exc: Exception) -> None:
        """A step raised: fail and abort the requests it ran (every running request, queued ones stay; when
        none was running, the queued ones it was admitting), prove the pool's ownership again and go on
        serving. Re-raises (the engine is then declared dead) after `MAX_STEP_FAILURES` failed steps in a
        row or when the ownership proof fails."""
        self._step_failures += 1
        victims = list(engine.scheduler.running) or list(engine.scheduler.waiting)
        logger.error(f"a step failed ({self._step_failures} in a row): failing its {len(victims)} requests",
                     exc_info=exc)
        if self._step_failures >= MAX_STEP_FAILURES:
            raise exc
        for req in victims:
            engine.abort(req.rid)
            live = self._live.pop(req.rid, None)
            if live is not None:
                engine.forget(req.rid)
                self.metrics.on_abort()
                self.num_aborted += 1
                self._loop.call_soon_threadsafe(live.events.put_nowait, exc)
        engine.check_memory()

    def _compiles(self) -> tuple[int, int]:
        log = self.compile_log
        return (0, 0) if log is None else log.foreground

    def _log_interval(self, engine: Engine) -> None:
        usage = kv_usage(engine)
        gauges = self.metrics.snapshot()
        logger.info(server_log.interval_line(
            num_running=len(engine.scheduler.running), num_queue=len(engine.scheduler.waiting),
            used_tokens=usage.used_slots, token_usage=usage.token_usage,
            cache_hit_rate=gauges["cache_hit_rate"], throughput=gauges["throughput"],
            accept_length=gauges["accept_length"]))

    def _take_snapshot(self, engine: Engine) -> None:
        """Publish the state control-plane reads see (one dict, replaced whole: readers on other threads
        never see a half-built one). The ownership proof runs whenever nothing is running or queued (a step
        in flight then holds no KV) and something happened since the last proof; while requests are live,
        the proof's fields are absent."""
        usage = kv_usage(engine)
        num_running, num_waiting = len(engine.scheduler.running), len(engine.scheduler.waiting)
        self.metrics.on_step(usage, num_running, num_waiting)
        memory = {**usage.as_dict(), "num_running": num_running, "num_waiting": num_waiting}
        previous = self.snapshot.get("memory", {})
        if num_running == num_waiting == 0:  # (a step may still be in flight: its requests hold no KV now)
            if self._memory_stale or "checked" not in previous:
                memory.update(engine.check_memory(), checked=True)
                self._memory_stale = False
            else:
                memory = previous
        self.snapshot = {"memory": memory, "time": time.time()}

    def _drain(self, block: bool) -> None:
        while True:
            try:
                command = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
            except queue.Empty:
                return
            if command is None:
                return
            block = False
            self._memory_stale = True
            fn, future = command
            try:
                result = fn(self.engine)
            except Exception as exc:  # reported to the caller (e.g. an invalid request -> HTTP 400)
                if future is not None:
                    self._loop.call_soon_threadsafe(_settle, future, None, exc)
            else:
                if future is not None:
                    self._loop.call_soon_threadsafe(_settle, future, result, None)

    def _publish(self, engine: Engine, rids: list[str]) -> None:
        for rid in rids:
            live = self._live[rid]
            req = engine.request(rid)
            num_ids = len(req.output_ids)
            if num_ids == live.num_sent and not req.finished:
                continue
            new_ids = list(req.output_ids[live.num_sent:])
            meta = req.meta_info()
            meta.setdefault("spec_verify_ct", 0)  # the engine has no speculative decoding yet
            event = Event(req.stop.stream_delta(), new_ids, req.finished, meta)
            self.metrics.on_tokens(req, len(new_ids), first=live.num_sent == 0 and num_ids > 0)
            live.num_sent = num_ids
            if req.finished:
                event.text, event.output_ids = req.stop.text, list(req.output_ids)
                self.metrics.on_finish(req, meta)
                self.num_finished += 1
                if self.log_requests:
                    logger.info(server_log.request_line(rid, meta))
                engine.forget(rid)
                del self._live[rid]
            self._loop.call_soon_threadsafe(live.events.put_nowait, event)

    def _fail_all(self, exc: BaseException) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
            if command is not None and command[1] is not None:
                self._loop.call_soon_threadsafe(_settle, command[1], None, exc)
        for live in self._live.values():
            self._loop.call_soon_threadsafe(live.events.put_nowait, exc)


def _settle(future: asyncio.Future, result: Any, exc: BaseException | None) -> None:
    if future.done():  # the awaiting handler was cancelled (client went away)
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)
