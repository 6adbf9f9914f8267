"""Process-wide caches of compiled step programs, their release, and the memory-mapping budget they use.

Engines over the same model graph share their `Programs` (the ahead-of-time executables of the jitted step
functions): each factory that builds them is cached per graph with `program_factory`. A cached factory keeps
its executables alive after the engines that used them are gone, until `release_unused_programs()` drops
every such cache (the executables an engine still holds stay alive with it).

That matters on the CPU backend, where each compiled program's machine code is loaded as many small object
files, three memory mappings each (code, read-only data, data): measured on jax 0.10.2 with the embedded
model, one EAGLE-3 round program holds about 700 mappings. Linux caps the mappings of a process at
`vm.max_map_count` (65530 by default); past it the next `mmap` fails and XLA dies with a segmentation fault
(seen in an executable's `serialize()` on a persistent-cache write). So a long notebook session or a test
process that builds many engine variants must release unused programs, and `check_mapping_headroom()` runs
before every compile of `Programs` so that a process out of mappings gets an error that names the limit
instead of a crash. GPU and TPU executables live on the device and use no such mappings.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_FACTORIES: list[Any] = []  # the lru-cached program factories, in registration order

# mappings a compile may need: a few round programs of a small model (about 700 each on CPU), with room
MIN_FREE_MAPPINGS = 4096

_MAPS = Path("/proc/self/maps")
_MAX_MAP_COUNT = Path("/proc/sys/vm/max_map_count")


class MappingLimitError(RuntimeError):
    """The process is too close to the kernel's limit on memory mappings to compile another program."""


def program_factory(maxsize: int) -> Callable[[F], F]:
    """`functools.lru_cache(maxsize)` for a function that builds `Programs`, registered so that
    `release_unused_programs` can clear it."""

    def wrap(fn: F) -> F:
        cached = functools.lru_cache(maxsize=maxsize)(fn)
        _FACTORIES.append(cached)
        return cached  # type: ignore[return-value]

    return wrap


def release_unused_programs() -> None:
    """Drop every cached program factory's entries and collect garbage: the executables no live engine
    holds are freed, with their host memory and (on CPU) their machine code's memory mappings. An engine
    built afterwards compiles its programs again (a load, when the persistent compilation cache has them).
    Functions jitted outside jaxserve keep theirs until `jax.clear_caches()`."""
    for cached in _FACTORIES:
        cached.cache_clear()
    gc.collect()


def memory_mappings() -> tuple[int, int] | None:
    """(mappings of this process, the kernel's limit per process), or None where /proc does not say
    (not Linux)."""
    try:
        limit = int(_MAX_MAP_COUNT.read_text())
        with _MAPS.open("rb") as maps:
            used = sum(1 for _ in maps)
    except (OSError, ValueError):
        return None
    return used, limit


def check_mapping_headroom(min_free: int | None = None) -> None:
    """Raise `MappingLimitError` when fewer than `min_free` (default `MIN_FREE_MAPPINGS`) memory mappings
    are left to this process (Linux; elsewhere a no-op). Costs one read of /proc/self/maps (milliseconds at
    tens of thousands of mappings): meant before a compile, which takes far longer."""
    min_free = MIN_FREE_MAPPINGS if min_free is None else min_free
    counts = memory_mappings()
    if counts is None:
        return
    used, limit = counts
    if limit - used < min_free:
        raise MappingLimitError(
            f"this process uses {used} of its {limit} memory mappings (vm.max_map_count), fewer than "
            f"{min_free} left: compiling another program could crash it. Release the programs of engines no "
            f"longer used (jaxserve.engine.program_cache.release_unused_programs()), or raise the limit "
            f"(sysctl -w vm.max_map_count=262144)")
