"""Prometheus metrics of one server (its own registry), under SGLang's names and `model_name` label.

The prefix is `sglang:` by default, so dashboards built for SGLang read them unchanged; `--metrics-prefix
jaxserve` gives `jaxserve:` names instead. The registry also carries prometheus_client's process, platform
and GC collectors (`process_resident_memory_bytes`, `python_info`, ...; the process collector only where
/proc exists).

Updated from the engine thread (`EngineLoop`): `on_submit`, `on_tokens`, `on_finish`, `on_abort` per request,
`on_step(usage, num_running, num_queue)` after every loop iteration. Read by `/metrics` (`render`) and
`/get_server_info` (`snapshot`). prometheus_client's metrics are thread-safe.

Gauges: `token_usage` = KV slots held by live requests or locked tree nodes / all slots (evictable cached
prefixes count as free, as in SGLang); `num_used_tokens` those slots, `max_total_num_tokens` all slots,
`kv_evictable_tokens` / `kv_available_tokens` cached-unlocked and free slots (the `swa_` ones likewise for
the sliding-window pool of hybrid models, 0 otherwise); `cache_hit_rate` = cached prompt tokens / prompt
tokens of finished requests; `spec_accept_length` = completion tokens / verify rounds (1.0 without
speculative decoding); `gen_throughput` = generated tokens per second over the last `window_s` seconds.
Histograms (seconds): time to first token, end-to-end latency, inter-token latency, and
`time_per_output_token_seconds` = (e2e - ttft) / (completion tokens - 1) per finished request.
"""

from __future__ import annotations

import collections
import dataclasses
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
METRIC_PREFIXES = ("sglang", "jaxserve")


@dataclasses.dataclass(frozen=True)
class KVUsage:
    """Slot accounting of one engine's KV pool at one moment (units: token slots). `swa_*` are 0 for
    pools without a sliding-window group."""

    num_slots: int
    free_slots: int
    evictable_slots: int
    swa_num_slots: int = 0
    swa_free_slots: int = 0
    swa_evictable_slots: int = 0

    @property
    def used_slots(self) -> int:
        return self.num_slots - self.free_slots - self.evictable_slots

    @property
    def token_usage(self) -> float:
        return self.used_slots / self.num_slots

    @property
    def swa_token_usage(self) -> float:
        used = self.swa_num_slots - self.swa_free_slots - self.swa_evictable_slots
        return used / self.swa_num_slots if self.swa_num_slots else 0.0

    def as_dict(self) -> dict[str, float]:
        """The fields plus `token_usage` (and the SWA ones when there is an SWA group)."""
        out: dict[str, float] = {"num_slots": self.num_slots, "free_slots": self.free_slots,
                                 "evictable_slots": self.evictable_slots, "token_usage": self.token_usage}
        if self.swa_num_slots:
            out.update(swa_num_slots=self.swa_num_slots, swa_free_slots=self.swa_free_slots,
                       swa_evictable_slots=self.swa_evictable_slots, swa_token_usage=self.swa_token_usage)
        return out


class ServerMetrics:
    """The server's metrics. `prefix`: one of `METRIC_PREFIXES`; `model_name`: the label value (the served
    model name); `window_s`: the throughput window in seconds."""

    def __init__(self, model_name: str = "", prefix: str = "sglang", window_s: float = 10.0) -> None:
        if prefix not in METRIC_PREFIXES:
            raise ValueError(f"metrics prefix {prefix!r}; choose one of {METRIC_PREFIXES}")
        self.registry = r = CollectorRegistry()
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        p, labels = prefix + ":", {"model_name": model_name}

        def counter(name: str, text: str):
            return Counter(p + name, text, ["model_name"], registry=r).labels(**labels)

        def gauge(name: str, text: str):
            return Gauge(p + name, text, ["model_name"], registry=r).labels(**labels)

        def histogram(name: str, text: str):
            return Histogram(p + name, text, ["model_name"], registry=r,
                             buckets=_LATENCY_BUCKETS).labels(**labels)

        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of finished requests")
        self.generation_tokens = counter("generation_tokens", "Generated tokens")
        self.cached_tokens = counter("cached_tokens", "Prompt tokens reused from the prefix cache")
        self.num_requests = counter("num_requests", "Finished requests (aborted included)")
        self.num_aborted = counter("num_aborted_requests", "Aborted requests")
        self.spec_verify_ct = counter("spec_verify_ct", "Speculative verify rounds")
        self.num_running = gauge("num_running_reqs", "Requests running")
        self.num_queue = gauge("num_queue_reqs", "Requests waiting")
        self.token_usage = gauge("token_usage", "KV slots in use / all KV slots")
        self.num_used_tokens = gauge("num_used_tokens", "KV slots held by live requests or locked prefixes")
        self.max_total_num_tokens = gauge("max_total_num_tokens", "KV slots in the pool")
        self.evictable_tokens = gauge("kv_evictable_tokens", "KV slots of cached, unlocked prefixes")
        self.available_tokens = gauge("kv_available_tokens", "KV slots free")
        self.swa_token_usage = gauge("swa_token_usage", "SWA KV slots in use / all SWA slots")
        self.swa_evictable_tokens = gauge("swa_evictable_tokens", "SWA KV slots of cached, unlocked prefixes")
        self.swa_available_tokens = gauge("swa_available_tokens", "SWA KV slots free")
        self.cache_hit_rate = gauge("cache_hit_rate", "Cached / all prompt tokens")
        self.accept_length = gauge("spec_accept_length", "Tokens per verify round")
        self.throughput = gauge("gen_throughput", "Generated tokens per second (recent)")
        self.ttft = histogram("time_to_first_token_seconds", "Time to first token")
        self.e2e = histogram("e2e_request_latency_seconds", "End-to-end request latency")
        self.itl = histogram("inter_token_latency_seconds", "Time between tokens")
        self.tpot = histogram("time_per_output_token_seconds", "Time per output token after the first")
        self.accept_length.set(1.0)
        self._window_s = window_s
        self._recent: collections.deque[tuple[float, int]] = collections.deque()
        self._recent_tokens = 0  # sum of the counts in `_recent`
        self._last_token_time: dict[str, float] = {}
        self._first_token_time: dict[str, float] = {}
        self._totals = {"prompt": 0, "cached": 0, "completion": 0, "verify": 0}
        self._last_step = {"num_running": 0, "num_queue": 0, "token_usage": 0.0, "throughput": 0.0}

    # ------------------------------------------------------------------ engine thread
    def on_submit(self, req) -> None:
        self._last_token_time[req.rid] = time.perf_counter()

    def on_tokens(self, req, num_tokens: int, first: bool) -> None:
        if num_tokens == 0:
            return
        now = time.perf_counter()
        self.generation_tokens.inc(num_tokens)
        self._recent.append((now, num_tokens))
        self._recent_tokens += num_tokens
        if first:
            self.ttft.observe(now - req.arrival_time)
            self._first_token_time[req.rid] = now
        elif req.rid in self._last_token_time:
            self.itl.observe((now - self._last_token_time[req.rid]) / num_tokens)
        self._last_token_time[req.rid] = now

    def on_finish(self, req, meta: dict) -> None:
        self._last_token_time.pop(req.rid, None)
        first = self._first_token_time.pop(req.rid, None)
        self.num_requests.inc()
        self.e2e.observe(meta["e2e_latency"])
        if first is not None and meta["completion_tokens"] > 1:
            self.tpot.observe((time.perf_counter() - first) / (meta["completion_tokens"] - 1))
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

    def on_step(self, usage: KVUsage, num_running: int, num_queue: int) -> None:
        self.num_running.set(num_running)
        self.num_queue.set(num_queue)
        self.token_usage.set(usage.token_usage)
        self.num_used_tokens.set(usage.used_slots)
        self.max_total_num_tokens.set(usage.num_slots)
        self.evictable_tokens.set(usage.evictable_slots)
        self.available_tokens.set(usage.free_slots)
        self.swa_token_usage.set(usage.swa_token_usage)
        self.swa_evictable_tokens.set(usage.swa_evictable_slots)
        self.swa_available_tokens.set(usage.swa_free_slots)
        now = time.perf_counter()
        while self._recent and self._recent[0][0] < now - self._window_s:
            self._recent_tokens -= self._recent.popleft()[1]
        throughput = self._recent_tokens / self._window_s
        self.throughput.set(throughput)
        self._last_step = {"num_running": num_running, "num_queue": num_queue,
                           "token_usage": usage.token_usage, "throughput": throughput}

    # ------------------------------------------------------------------ readers
    def render(self) -> bytes:
        return generate_latest(self.registry)

    def snapshot(self) -> dict[str, float]:
        """Current gauge values (for /get_server_info and the interval log line)."""
        t = self._totals
        return {"num_running": self._last_step["num_running"], "num_queue": self._last_step["num_queue"],
                "token_usage": self._last_step["token_usage"],
                "cache_hit_rate": t["cached"] / t["prompt"] if t["prompt"] else 0.0,
                "accept_length": t["completion"] / t["verify"] if t["verify"] else 1.0,
                "throughput": self._last_step["throughput"]}


def kv_usage(engine) -> KVUsage:
    """Slot accounting of `engine.kv` now. Call on the engine thread."""
    kv = engine.kv
    tree = kv.tree
    if not kv.hybrid:
        return KVUsage(kv.num_slots, int(kv.allocator.available_size()), int(tree.evictable_size))
    swa_slots = kv.swa_num_pages * kv.page_size
    return KVUsage(kv.num_slots, int(kv.allocator.full_available_size()), int(tree.full_evictable_size),
                   swa_slots, int(kv.allocator.swa_available_size()), int(tree.swa_evictable_size))
