"""Prometheus metrics of one server (its own registry), named like SGLang's with a `jaxserve:` prefix.

Updated from the engine thread (`EngineLoop`): `on_submit`, `on_tokens`, `on_finish`, `on_abort` per request,
`on_step` after every loop iteration (gauges: queue, running, KV usage, throughput). Read by `/metrics`
(`render`) and `/get_server_info` (`snapshot`). prometheus_client's metrics are thread-safe.

Gauges: `token_usage` = KV slots held by live requests or locked tree nodes / all slots (evictable cached
prefixes count as free, as in SGLang); `cache_hit_rate` = cached prompt tokens / prompt tokens of finished
requests; `spec_accept_length` = completion tokens / verify rounds (1.0 without speculative decoding);
`gen_throughput` = generated tokens per second over the last `window_s` seconds.
"""

from __future__ import annotations

import collections
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class ServerMetrics:
    def __init__(self, window_s: float = 10.0) -> None:
        self.registry = CollectorRegistry()
        r, p = self.registry, "jaxserve:"
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter(p + "generation_tokens", "Generated tokens", registry=r)
        self.cached_tokens = Counter(p + "cached_tokens", "Prompt tokens reused from the prefix cache",
                                     registry=r)
        self.num_requests = Counter(p + "num_requests", "Finished requests (aborted included)", registry=r)
        self.num_aborted = Counter(p + "num_aborted_requests", "Aborted requests", registry=r)
        self.spec_verify_ct = Counter(p + "spec_verify_ct", "Speculative verify rounds", registry=r)
        self.num_running = Gauge(p + "num_running_reqs", "Requests running", registry=r)
        self.num_queue = Gauge(p + "num_queue_reqs", "Requests waiting", registry=r)
        self.token_usage = Gauge(p + "token_usage", "KV slots in use / all KV slots", registry=r)
        self.cache_hit_rate = Gauge(p + "cache_hit_rate", "Cached / all prompt tokens", registry=r)
        self.accept_length = Gauge(p + "spec_accept_length", "Tokens per verify round", registry=r)
        self.throughput = Gauge(p + "gen_throughput", "Generated tokens per second (recent)", registry=r)
        self.ttft = Histogram(p + "time_to_first_token_seconds", "Time to first token", registry=r,
                              buckets=_LATENCY_BUCKETS)
        self.e2e = Histogram(p + "e2e_request_latency_seconds", "End-to-end request latency", registry=r,
                             buckets=_LATENCY_BUCKETS)
        self.itl = Histogram(p + "inter_token_latency_seconds", "Time between tokens", registry=r,
                             buckets=_LATENCY_BUCKETS)
        self.accept_length.set(1.0)
        self._window_s = window_s
        self._recent: collections.deque[tuple[float, int]] = collections.deque()
        self._last_token_time: dict[str, float] = {}
        self._totals = {"prompt": 0, "cached": 0, "completion": 0, "verify": 0}

    # ------------------------------------------------------------------ engine thread
    def on_submit(self, req) -> None:
        self._last_token_time[req.rid] = time.perf_counter()

    def on_tokens(self, req, num_tokens: int, first: bool) -> None:
        if num_tokens == 0:
            return
        now = time.perf_counter()
        self.generation_tokens.inc(num_tokens)
        self._recent.append((now, num_tokens))
        if first:
            self.ttft.observe(now - req.arrival_time)
        elif req.rid in self._last_token_time:
            self.itl.observe((now - self._last_token_time[req.rid]) / num_tokens)
        self._last_token_time[req.rid] = now

    def on_finish(self, req, meta: dict) -> None:
        self._last_token_time.pop(req.rid, None)
        self.num_requests.inc()
        self.e2e.observe(meta["e2e_latency"])
        t = self._totals
        t["prompt"] += meta["prompt_tokens"]
        t["cached"] += meta["cached_tokens"]
        self.prompt_tokens.inc(meta["prompt_tokens"])
        self.cached_tokens.inc(meta["cached_tokens"])
        if meta["spec_verify_ct"] > 0:
            t["completion"] += meta["completion_tokens"]
            t["verify"] += meta["spec_verify_ct"]
            self.spec_verify_ct.inc(meta["spec_verify_ct"])
            self.accept_length.set(t["completion"] / t["verify"])
        if t["prompt"]:
            self.cache_hit_rate.set(t["cached"] / t["prompt"])

    def on_abort(self) -> None:
        self.num_aborted.inc()

    def on_step(self, engine) -> None:
        self.num_running.set(len(engine.scheduler.running))
        self.num_queue.set(len(engine.scheduler.waiting))
        self.token_usage.set(kv_usage(engine)["token_usage"])
        now = time.perf_counter()
        while self._recent and self._recent[0][0] < now - self._window_s:
            self._recent.popleft()
        self.throughput.set(sum(n for _, n in self._recent) / self._window_s)

    # ------------------------------------------------------------------ readers
    def render(self) -> bytes:
        return generate_latest(self.registry)

    def snapshot(self) -> dict[str, float]:
        """Current gauge values (for /get_server_info)."""
        names = ("num_running", "num_queue", "token_usage", "cache_hit_rate", "accept_length", "throughput")
        return {name: getattr(self, name)._value.get() for name in names}


def kv_usage(engine) -> dict[str, float]:
    """Slot accounting of `engine.kv`: total, free, evictable (cached, unlocked) and the usage ratio.
    Call on the engine thread."""
    kv = engine.kv
    tree = kv.tree
    evictable = tree.full_evictable_size if kv.hybrid else tree.evictable_size
    free = kv.allocator.full_available_size() if kv.hybrid else kv.allocator.available_size()
    used = kv.num_slots - free - evictable
    return {"num_slots": kv.num_slots, "free_slots": int(free), "evictable_slots": int(evictable),
            "token_usage": used / kv.num_slots}
