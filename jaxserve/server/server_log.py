"""What the server prints to stderr for an operator: one line per interval while busy, one per compile, one
per request with `--log-requests`, and one at shutdown. Never a secret (the API key is not printed).

Lines (the first shaped like SGLang's decode log line, so log scrapers written for it keep working):

    [2026-12-02 01:23:45] Decode batch. #running-req: 3, #queue-req: 0, #token: 412, token usage: 0.05,
        cache hit rate: 12.5%, gen throughput (token/s): 40.1, accept len: 1.82
    [...] compile: jit(step) 2.31 s                                  (jaxserve.server.compile_cache)
    [...] Compile stall: a step with 5 live requests took 2.40 s, 1 compile(s)
    [...] Finish: rid=req-7, prompt_tokens=12, completion_tokens=20, cached_tokens=8, finish=length, ...
    [...] Shutdown: 120 requests finished (3 aborted) in 61.2 s of uptime
"""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger("jaxserve.server")
_handler = logging.StreamHandler(sys.stderr)
_handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s", "%Y-%m-%d %H:%M:%S"))


def configure_logging(level: str = "info") -> None:
    """Send the `jaxserve` loggers to stderr with a timestamp, at `level` (debug, info, warning, error).
    Idempotent: a second call only changes the level."""
    root = logging.getLogger("jaxserve")
    root.setLevel(level.upper())
    if _handler not in root.handlers:
        root.addHandler(_handler)
        root.propagate = False


def interval_line(*, num_running: int, num_queue: int, used_tokens: int, token_usage: float,
                  cache_hit_rate: float, throughput: float, accept_length: float) -> str:
    """The busy-interval line. `token_usage` and `cache_hit_rate` are fractions; `throughput` tokens/s."""
    return (f"Decode batch. #running-req: {num_running}, #queue-req: {num_queue}, #token: {used_tokens}, "
            f"token usage: {token_usage:.2f}, cache hit rate: {100 * cache_hit_rate:.1f}%, "
            f"gen throughput (token/s): {throughput:.2f}, accept len: {accept_length:.2f}")


def compile_stall_line(*, num_reqs: int, seconds: float, num_compiles: int, num_cache_hits: int) -> str:
    """A step that waited on compilation: the live requests it held up and the seconds it took."""
    hits = f", {num_cache_hits} from the persistent cache" if num_cache_hits else ""
    return (f"Compile stall: a step with {num_reqs} live requests took {seconds:.2f} s, "
            f"{num_compiles + num_cache_hits} compile(s){hits}")


def request_line(rid: str, meta: dict) -> str:
    """A finished request's line (counts and latency only: prompts and outputs are never logged)."""
    reason = meta.get("finish_reason") or {}
    kind = reason.get("type") if isinstance(reason, dict) else reason
    return (f"Finish: rid={rid}, prompt_tokens={meta['prompt_tokens']}, "
            f"completion_tokens={meta['completion_tokens']}, cached_tokens={meta['cached_tokens']}, "
            f"finish={kind}, e2e_latency={meta['e2e_latency']:.3f} s")


def shutdown_line(*, num_finished: int, num_aborted: int, uptime_s: float) -> str:
    return f"Shutdown: {num_finished} requests finished ({num_aborted} aborted) in {uptime_s:.1f} s of uptime"
