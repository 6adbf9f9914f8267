"""JAX's persistent compilation cache for the server, and a per-compile log line.

`enable_compilation_cache(dir)` points JAX at a directory (default `default_cache_dir()`: the user's cache
directory, `$XDG_CACHE_HOME/jaxserve/jax` or `~/.cache/jaxserve/jax`; `JAX_COMPILATION_CACHE_DIR` wins over
the default) and lowers JAX's thresholds to zero: by default JAX only writes programs that took >= 1 s to
compile, which leaves out most of a CPU server's small step programs, so a restart would recompile them.

`CompileLog` counts compiles (JAX's monitoring events) and logs one line per compile: the function, its
seconds, and whether the persistent cache served it. JAX reports a compile duration on every compile
request, cache hits included; a hit is announced by a `cache_hits` event just before, on the same thread.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

logger = logging.getLogger("jaxserve.compile")

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_HIT_EVENT = "/jax/compilation_cache/cache_hits"
BACKGROUND_THREAD_PREFIX = "compile-"  # `runner.Programs` names its compile threads so


def default_cache_dir() -> Path:
    """`JAX_COMPILATION_CACHE_DIR` if set, else `<user cache dir>/jaxserve/jax`."""
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return Path(os.environ["JAX_COMPILATION_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "jaxserve" / "jax"


def enable_compilation_cache(cache_dir: str | Path | None = None) -> Path:
    """Turn on JAX's persistent compilation cache in `cache_dir` (created; default `default_cache_dir()`),
    caching every program however quick to compile or small. Call before the first compile. Returns the
    directory. Raises OSError naming the directory when it cannot be created."""
    import jax

    path = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OSError(f"cannot create the compilation cache directory {path}: {exc.strerror}; pass "
                      f"--compilation-cache-dir DIR or --disable-compilation-cache") from exc
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path


def disable_compilation_cache() -> None:
    """No persistent cache for this process (also when `JAX_COMPILATION_CACHE_DIR` is set)."""
    import jax

    jax.config.update("jax_enable_compilation_cache", False)


class CompileLog:
    """Counts compiles of this process from the moment it is installed and logs one INFO line per compile
    (`compile: jit(step) 2.31 s` or `... (persistent cache hit)`). `num_compiles` counts real compiles,
    `num_cache_hits` the ones the persistent cache served; `compile_s` sums the seconds of both;
    `foreground` counts (compiles, hits) outside the background compile threads (`runner.Programs`), the
    ones a caller waited for. Thread-safe: JAX calls the listeners on whichever thread compiles."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hit = threading.local()
        self.num_compiles = 0
        self.num_cache_hits = 0
        self.compile_s = 0.0
        self.foreground = (0, 0)

    def install(self) -> CompileLog:
        """Register with JAX's monitoring (listeners cannot be removed: install once per process)."""
        from jax import monitoring

        monitoring.register_event_listener(self._on_event)
        monitoring.register_event_duration_secs_listener(self._on_duration)
        return self

    def _on_event(self, event: str, **_: object) -> None:
        if event == _HIT_EVENT:
            self._hit.pending = True

    def _on_duration(self, event: str, duration_s: float, **kwargs: object) -> None:
        if event != _COMPILE_EVENT:
            return
        hit = getattr(self._hit, "pending", False)
        self._hit.pending = False
        background = threading.current_thread().name.startswith(BACKGROUND_THREAD_PREFIX)
        with self._lock:
            self.compile_s += duration_s
            if hit:
                self.num_cache_hits += 1
            else:
                self.num_compiles += 1
            if not background:
                compiles, hits = self.foreground
                self.foreground = (compiles + (not hit), hits + hit)
        name = kwargs.get("fun_name", "?")
        logger.info("compile: %s %.2f s%s%s", name, duration_s, " (persistent cache hit)" if hit else "",
                    " (background)" if background else "")
