"""Command-line flags of `python -m jaxserve.launch_server`, with SGLang's names, and `--config` YAML files.

`parse_launch_args(argv)` returns a `LaunchArgs`: the HTTP settings and the keyword arguments for
`jaxserve.api.Engine` (fields of `ServerArgs`). Precedence: explicit flags > `--config` file > the
engine's defaults. A flag left unset is not passed on, so `ServerArgs` keeps its own default.

Flags that the engine cannot honour yet fail with
`UnsupportedFlagError` naming the flag, unless the engine's `ServerArgs` has grown the matching field, in
which case the value is passed through unchanged.

`--attention-backend` takes our backend names and SGLang's (`triton`, `fa3`, `flashinfer`, `torch_native`,
...): `jaxserve.server.attention_choice` maps each onto the best backend of ours on this platform, and the
launcher prints one line naming the choice (a warning when the asked-for kernel cannot run here).

Operations: `--compilation-cache-dir` / `--disable-compilation-cache` (JAX's persistent compilation cache,
on by default), `--metrics-prefix`, `--enable-metrics` (SGLang's flag; metrics are always on),
`--log-requests`, `--decode-log-interval`, `--cache-snapshot DIR` (warm restart, `server.cache_snapshot`).
Without `--random-seed` the server draws a random base seed for unseeded requests at start (SGLang's
behaviour: sampling differs across restarts).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jaxserve.engine.config import ServerArgs
from jaxserve.server.attention_choice import BackendChoice, registered_backends, resolve_attention_backend

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 30000
_DTYPE_ALIASES = {"half": "float16", "float": "float32", "bf16": "bfloat16"}


class UnsupportedFlagError(ValueError):
    """A flag jaxserve parses (SGLang has it) but cannot honour yet; the message names the flag."""


@dataclasses.dataclass(frozen=True)
class LaunchArgs:
    """What `launch_server` needs. `model_path` None means the embedded default; `engine_kwargs` are
    `ServerArgs` fields given explicitly (by a flag or the config file)."""

    model_path: str | None
    tokenizer_path: str | None
    host: str
    port: int
    api_key: str | None
    served_model_name: str | None
    engine_kwargs: dict[str, Any]
    log_level: str = "warning"
    attention_choice: BackendChoice | None = None  # how --attention-backend was resolved, when given
    compilation_cache_dir: str | None = None  # None: the default directory (see server.compile_cache)
    disable_compilation_cache: bool = False
    cache_snapshot: str | None = None  # warm restart directory (see server.cache_snapshot)
    metrics_prefix: str = "sglang"
    log_requests: bool = False
    decode_log_interval: int = 40  # busy steps between interval log lines (0: none)


# (flag, type, help). Engine flags map to the ServerArgs field of the same name (dashes -> underscores).
_ENGINE_FLAGS: tuple[tuple[str, Any, str], ...] = (
    ("--dtype", str, "auto | float32 | bfloat16 | float16 (aliases: half, float, bf16)"),
    ("--page-size", int, "KV slots per page"),
    ("--max-total-tokens", int, "KV pool size in token slots"),
    ("--chunked-prefill-size", int, "most tokens computed in one step (prefill chunks + decodes)"),
    ("--max-running-requests", int, "most requests decoding at once"),
    ("--context-length", int, "longest prompt + output (default: the model's)"),
    ("--swa-full-tokens-ratio", float, "SWA pool size relative to the full pool (hybrid SWA models)"),
    ("--random-seed", int, "base seed of requests without their own (default: random per start)"),
    ("--grammar-backend", str, "constrained decoding (json_schema / regex / ebnf, response_format): "
                               "llguidance (default), xgrammar (an optional extra: pip install "
                               "'jaxserve[xgrammar]') or none"),
    ("--attention-backend", str, "attention kernels: ours (native, xla, ...) or SGLang's names (triton, "
                                 "fa3, flashinfer, torch_native, ...), mapped to the best of ours here"),
    ("--mem-fraction-static", float, "size the KV pool from device memory: weights + pools take this "
                                     "fraction (--max-total-tokens, when given, wins); the plan is printed"),
    ("--tp-size", int, "tensor-parallel degree: weights and KV pools sharded over the first N devices"),
    ("--ep-size", int, "MoE experts over the tp devices, a divisor of tp: tp (default) = whole experts per "
                       "device, 1 = each expert's intermediate dimension split, between = ep groups of "
                       "experts, each expert split over the tp/ep devices of its group"),
    ("--dist-init-addr", str, "multi-host: HOST:PORT of the coordinator (rank 0's host), the same on "
                              "every node"),
    ("--nnodes", int, "multi-host: number of processes (one per host)"),
    ("--node-rank", int, "multi-host: this process's rank in [0, nnodes); rank 0 serves HTTP"),
    ("--speculative-algorithm", str, "EAGLE3: speculative decoding with an EAGLE-3 draft head"),
    ("--speculative-draft-model-path", str, "EAGLE-3 draft checkpoint directory"),
    ("--speculative-num-steps", int, "draft steps per round"),
    ("--speculative-eagle-topk", int, "draft branching factor (1: a chain; > 1: tree drafting)"),
    ("--speculative-num-draft-tokens", int, "tokens verified per round (chain: num-steps + 1; tree: set it)"),
    ("--speculative-policy", str, "auto (default): per step, an EAGLE-3 round or a plain step, whichever "
                                  "measures faster at this batch size; always: a round every step (as "
                                  "SGLang); never: plain steps only"),
    ("--speculative-disable-batch-size", int, "decode plainly (drafts kept usable) at this many decoding "
                                              "requests or more"),
)
_ENGINE_SWITCHES = (
    ("--disable-radix-cache", "no prefix reuse across requests"),
    ("--disable-overlap-schedule", "apply each step's results before dispatching the next"),
    ("--disable-layer-scan", "jaxserve: unroll the decoder layers in the step instead of one lax.scan "
                             "over stacked layers (compile time then grows with depth)"),
    ("--warmup", "jaxserve: compile the common step programs with synthetic requests while serving "
                 "(/health reports the progress)"),
)
def build_parser() -> argparse.ArgumentParser:
    """The argparse parser (`allow_abbrev=False`: a misspelt flag is an error, never a prefix match)."""
    parser = argparse.ArgumentParser(
        prog="python -m jaxserve.launch_server", allow_abbrev=False,
        description="Serve a model over HTTP (SGLang's /generate and OpenAI's /v1 endpoints).")
    parser.add_argument("--config", help="YAML file of flags (keys as flag names); explicit flags win")
    parser.add_argument("--model-path", "--model", dest="model_path",
                        help="HF checkpoint directory (default: the embedded model); --model is an alias")
    parser.add_argument("--tokenizer-path", help="directory with tokenizer.json (default: --model-path)")
    parser.add_argument("--host", default=None, help=f"bind address (default {DEFAULT_HOST})")
    parser.add_argument("--port", type=int, default=None, help=f"port (default {DEFAULT_PORT}; 0: any)")
    parser.add_argument("--api-key", help="require 'Authorization: Bearer <key>' on every route but /health")
    parser.add_argument("--served-model-name", help="model name in /v1 responses (default: the path)")
    parser.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"),
                        help="uvicorn's log level (info adds an access log line per request); jaxserve's own "
                             "lines are at info unless this is error")
    ops = parser.add_argument_group("operations")
    ops.add_argument("--compilation-cache-dir", default=None,
                     help="JAX persistent compilation cache (default: ~/.cache/jaxserve/jax, or "
                          "$JAX_COMPILATION_CACHE_DIR)")
    ops.add_argument("--disable-compilation-cache", action="store_true", default=False,
                     help="compile every step program afresh at each start")
    ops.add_argument("--cache-snapshot", default=None, metavar="DIR",
                     help="warm restart: restore the prefix cache and its KV from DIR at start (a mismatched "
                          "or damaged snapshot is refused, the server starts cold); save them there on "
                          "graceful shutdown and on POST /save_cache")
    ops.add_argument("--enable-metrics", action="store_true", default=False,
                     help="accepted for SGLang compatibility: /metrics is always on")
    ops.add_argument("--metrics-prefix", default="sglang", choices=("sglang", "jaxserve"),
                     help="Prometheus metric name prefix (default sglang:, for SGLang dashboards)")
    ops.add_argument("--log-requests", action="store_true", default=False,
                     help="one log line per finished request (token counts and latency, no text)")
    ops.add_argument("--decode-log-interval", type=int, default=40,
                     help="busy steps between 'Decode batch' log lines (0: none)")
    group = parser.add_argument_group("engine (jaxserve.engine.ServerArgs)")
    for flag, kind, text in _ENGINE_FLAGS:
        group.add_argument(flag, type=kind, default=None, help=text)
    for flag, text in _ENGINE_SWITCHES:
        group.add_argument(flag, action="store_true", default=None, help=text)
    # debugging only, hidden from --help: EAGLE prefix tree keyed by tokens (the pre-fix behaviour)
    group.add_argument("--debug-token-keys", action="store_true", default=None, help=argparse.SUPPRESS)
    return parser


def load_config_file(path: str, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """Read a YAML mapping of flag names (`page-size` or `page_size`) to values; unknown keys, or a file
    that is not a mapping, raise ValueError naming them."""
    import yaml

    data = yaml.safe_load(Path(path).read_text())
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"--config {path}: expected a mapping of flag names to values")
    known = {action.dest for action in parser._actions} - {"help", "config"}
    values = {str(key).replace("-", "_"): value for key, value in data.items()}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"--config {path}: unknown key(s) {unknown}; keys are launch_server flag names")
    return values


def parse_launch_args(argv: Sequence[str] | None = None) -> LaunchArgs:
    """Parse flags (and `--config`); exits with argparse's usage error on an unknown flag or a bad value,
    raises UnsupportedFlagError for a flag the engine cannot honour yet."""
    parser = build_parser()
    first, _ = parser.parse_known_args(argv)
    if first.config:
        try:
            parser.set_defaults(**load_config_file(first.config, parser))
        except (OSError, ValueError) as exc:
            parser.error(str(exc))
    ns = parser.parse_args(argv)
    if ns.decode_log_interval < 0:
        parser.error(f"--decode-log-interval {ns.decode_log_interval}: must be >= 0")
    choice = None
    if ns.attention_backend is not None:
        if (ns.nnodes or 1) > 1:  # the choice asks JAX for the platform: join the group first
            _join_multihost(ns, parser)
        try:
            choice = resolve_attention_backend(ns.attention_backend)
        except ValueError as exc:
            parser.error(str(exc))
        ns.attention_backend = choice.backend
    try:
        engine_kwargs = engine_kwargs_from(vars(ns))
        ServerArgs.from_kwargs(engine_kwargs)  # the engine's own range checks, reported as usage errors
    except ValueError as exc:
        if isinstance(exc, UnsupportedFlagError):
            raise
        parser.error(str(exc))
    return LaunchArgs(model_path=ns.model_path, tokenizer_path=ns.tokenizer_path,
                      host=ns.host or DEFAULT_HOST, port=DEFAULT_PORT if ns.port is None else ns.port,
                      api_key=ns.api_key, served_model_name=ns.served_model_name, engine_kwargs=engine_kwargs,
                      log_level=ns.log_level, attention_choice=choice,
                      compilation_cache_dir=ns.compilation_cache_dir,
                      disable_compilation_cache=ns.disable_compilation_cache,
                      cache_snapshot=ns.cache_snapshot,
                      metrics_prefix=ns.metrics_prefix,
                      log_requests=ns.log_requests, decode_log_interval=ns.decode_log_interval)


def _join_multihost(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """`jax.distributed.initialize` for the multi-host flags in `ns` (checked first: a usage error names a
    bad one). It must come before any other JAX call, which `--attention-backend`'s resolution makes."""
    from jaxserve.engine import multihost

    try:
        ServerArgs(nnodes=ns.nnodes, node_rank=ns.node_rank or 0, dist_init_addr=ns.dist_init_addr)
    except ValueError as exc:
        parser.error(str(exc))
    multihost.initialize(ns.dist_init_addr, ns.nnodes, ns.node_rank or 0)


def engine_kwargs_from(values: dict[str, Any]) -> dict[str, Any]:
    """The `ServerArgs` keyword arguments among parsed flag values (unset ones dropped). A value for a field
    `ServerArgs` lacks raises UnsupportedFlagError, unless it is the neutral value (e.g. --tp-size 1)."""
    fields = {f.name for f in dataclasses.fields(ServerArgs)}
    names = [flag[2:].replace("-", "_") for flag, *_ in (*_ENGINE_FLAGS, *_ENGINE_SWITCHES)]
    names.append("debug_token_keys")
    kwargs: dict[str, Any] = {}
    for name in names:
        value = values.get(name)
        if value is None:
            continue
        if name == "dtype":
            value = _DTYPE_ALIASES.get(value, value)
        if name == "attention_backend" and value not in (*registered_backends(), "auto"):
            raise UnsupportedFlagError(f"--attention-backend {value}: not a jaxserve backend (registered: "
                                       f"{', '.join(registered_backends())}); parse_launch_args maps "
                                       f"SGLang's names onto these")
        if name in fields:
            kwargs[name] = value
        else:  # a parsed flag the engine has no field for
            flag = "--" + name.replace("_", "-")
            raise UnsupportedFlagError(f"{flag} {value}: not supported yet by the jaxserve engine "
                                       f"(jaxserve.engine.ServerArgs has no '{name}'); drop the flag")
    if kwargs.get("speculative_algorithm") not in (None, "EAGLE3") and "speculative_algorithm" in fields:
        raise UnsupportedFlagError(f"--speculative-algorithm {kwargs['speculative_algorithm']}: only "
                                   f"EAGLE3 is implemented")
    return kwargs
