"""Start a server: build the `Engine` from `LaunchArgs`, bind the socket, run uvicorn until SIGINT/SIGTERM.

Once the socket listens and the engine thread runs, one line `jaxserve ready on http://HOST:PORT` is printed
to stdout (tests and scripts wait for it; with `--port 0` it carries the port the OS chose), followed by a
curl command and the send_one command (the API key, when set, is never printed). On SIGINT/SIGTERM uvicorn
stops accepting connections, lets open ones finish for up to `GRACEFUL_SHUTDOWN_S`, then the engine thread
aborts what is left, one `Shutdown:` line goes to stderr; exit status 0 (a background compile still running
then is left unfinished: the process exits without waiting for it).

Multi-host (`--nnodes N`, `engine.multihost`): every rank runs this same command; each first joins the
`jax.distributed` group, then builds the same engine. Rank 0 binds the socket and serves; a rank > 0 binds
nothing and follows rank 0's steps until rank 0 stops (it broadcasts the stop after uvicorn returns), then
exits 0. Background compiles stay off there (all ranks must run the same executable).

Before the engine is built, JAX's persistent compilation cache is turned on (`server.compile_cache`; a
restarted server then loads its step programs instead of compiling them) and the `jaxserve` loggers are
set up (`server.server_log`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import secrets
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence

from jaxserve.server import compile_cache, preflight, server_log, warmup
from jaxserve.server.args import LaunchArgs, UnsupportedFlagError, parse_launch_args

logger = logging.getLogger("jaxserve.server")

GRACEFUL_SHUTDOWN_S = 20  # live requests are aborted first; this covers a step (or a compile) in flight
COMPILE_STOP_S = 2.0  # at exit, how long a background compile in progress is waited for


class LaunchError(RuntimeError):
    """The server cannot start (missing model, bad configuration); the message says what to do."""


def resolve_model(args: LaunchArgs) -> tuple[str, dict]:
    """The model directory and engine kwargs: `--model-path`, or the embedded default (with its EAGLE-3
    draft when the engine supports speculative decoding: always when no speculative flag is given, and as
    the draft of `--speculative-algorithm EAGLE3` without `--speculative-draft-model-path`, with a note on
    stderr). Raises LaunchError when neither exists."""
    from jaxserve.assets import EMBEDDED_DRAFT_DIR, EMBEDDED_MODEL_DIR, embedded_model_available
    from jaxserve.engine.config import ServerArgs

    if args.model_path is not None:
        return args.model_path, dict(args.engine_kwargs)
    if not embedded_model_available():
        raise LaunchError(f"no --model-path given and the embedded default model is missing "
                          f"({EMBEDDED_MODEL_DIR}/model.safetensors); pass --model-path <HF checkpoint dir> "
                          f"or build it with `python -m jaxserve.training.build_embedded`")
    kwargs = dict(args.engine_kwargs)
    spec_supported = "speculative_algorithm" in ServerArgs.__dataclass_fields__
    if kwargs.get("nnodes", 1) > 1:
        spec_supported = False  # the engine refuses EAGLE-3 across processes
    if spec_supported and EMBEDDED_DRAFT_DIR.exists() and "speculative_algorithm" not in kwargs:
        kwargs.update(speculative_algorithm="EAGLE3", speculative_draft_model_path=str(EMBEDDED_DRAFT_DIR))
    elif spec_supported and kwargs.get("speculative_algorithm") and not kwargs.get(
            "speculative_draft_model_path") and EMBEDDED_DRAFT_DIR.exists():
        # SGLang's spelling names the algorithm and the draft; on the embedded default the draft is ours
        kwargs["speculative_draft_model_path"] = str(EMBEDDED_DRAFT_DIR)
        print(f"note: --speculative-algorithm {kwargs['speculative_algorithm']} without "
              f"--speculative-draft-model-path: using the embedded EAGLE-3 head ({EMBEDDED_DRAFT_DIR})",
              file=sys.stderr)
    elif not spec_supported:
        print("note: no speculative decoding with this configuration; serving the embedded model without "
              "its EAGLE-3 draft", file=sys.stderr)
    return str(EMBEDDED_MODEL_DIR), kwargs


def build_engine(args: LaunchArgs):
    """The Engine for `args` (model loaded from disk; `--tokenizer-path` loads the tokenizer separately),
    after `preflight` checked the files (PreflightError, a ValueError, names a broken one). `--warmup` is
    not the engine's here: the server warms up while it serves (`server.warmup`)."""
    from jaxserve.api import Engine

    model_path, kwargs = resolve_model(args)
    kwargs.pop("warmup", None)
    preflight.check_launch_files(model_path, args.tokenizer_path,
                                 kwargs.get("speculative_draft_model_path")
                                 if kwargs.get("speculative_algorithm") else None)
    if args.tokenizer_path is None:
        return Engine(model_path=model_path, **kwargs)
    from jaxserve.engine.config import ServerArgs
    from jaxserve.loader.load import load_model
    from jaxserve.loader.tokenizer import HFTokenizer
    from jaxserve.speculative.loading import load_draft

    server_args = ServerArgs.from_kwargs({"model_path": model_path, **kwargs})
    draft = load_draft(server_args) if server_args.speculative_algorithm is not None else None
    aux_ids = tuple(draft.config.aux_layer_ids) if draft is not None else ()  # layers the draft reads
    dtype = None if server_args.dtype == "auto" else server_args.dtype
    model = load_model(model_path, dtype=dtype, backend=server_args.attention_backend,
                       aux_hidden_state_layer_ids=aux_ids)
    return Engine(model_path=model_path, model=model, tokenizer=HFTokenizer(args.tokenizer_path),
                  draft_model=draft, **kwargs)


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise LaunchError(f"cannot listen on {host}:{port}: {exc.strerror}; pick another --port") from exc
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def banner(host: str, port: int, api_key: str | None) -> str:
    """The ready banner: the URL, a curl command, the send_one command. With an API key the curl command
    reads it from `$JAXSERVE_API_KEY` (the key itself is never printed)."""
    url = f"http://{host}:{port}"
    auth = ' -H "Authorization: Bearer $JAXSERVE_API_KEY"' if api_key else ""
    return "\n".join([
        f"jaxserve ready on {url}",
        f"  curl {url}/generate{auth} -H 'Content-Type: application/json' "
        """-d '{"text": "Once upon a time,", "sampling_params": {"max_new_tokens": 32, "temperature": 0}}'""",
        f"  python -m jaxserve.test.send_one --host {host} --port {port} --max-new-tokens 32",
        f"  OpenAI clients: base_url={url}/v1",
    ])


def _make_server(config, on_first_exit: Callable[[], None]):
    """uvicorn's Server, with SIGINT/SIGTERM handled on the event loop: the first aborts every live request
    (`on_first_exit`, so open streams end now) and starts a graceful shutdown, a second forces it; either way
    the process then exits 0 (uvicorn would re-raise the signal)."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame) -> None:
            if not self.should_exit:
                on_first_exit()
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self):
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self.handle_exit, sig, None)
            try:
                yield
            finally:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(sig)

    return Server(config)


async def _serve(server, sock: socket.socket, text: str) -> None:
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not task.done():
        await asyncio.sleep(0.05)
    if server.started:
        print(text, flush=True)
    await task


def with_random_seed(args: LaunchArgs) -> LaunchArgs:
    """`args` with a `random_seed` for the engine: `--random-seed` if given, else one drawn at random (so
    unseeded sampling differs across restarts, as in SGLang)."""
    if "random_seed" in args.engine_kwargs:
        return args
    seeded = {**args.engine_kwargs, "random_seed": secrets.randbits(63)}
    return dataclasses.replace(args, engine_kwargs=seeded)


def setup_compilation_cache(args: LaunchArgs) -> str:
    """Turn JAX's persistent compilation cache on (or off, `--disable-compilation-cache`); returns a
    sentence for the log. Raises LaunchError when the directory cannot be created."""
    if args.disable_compilation_cache:
        compile_cache.disable_compilation_cache()
        return "compilation cache: disabled"
    try:
        path = compile_cache.enable_compilation_cache(args.compilation_cache_dir)
    except OSError as exc:
        raise LaunchError(str(exc)) from exc
    return f"compilation cache: {path}"


def start_multihost(args: LaunchArgs) -> None:
    """Join the multi-host group (`engine.multihost.initialize`) before anything else touches JAX; refuses
    what cannot run in lock-step across processes. Raises LaunchError / ValueError with the reason."""
    from jaxserve.engine import multihost

    kw = args.engine_kwargs
    if args.cache_snapshot is not None:
        raise LaunchError("--cache-snapshot with --nnodes > 1 is not supported yet (the restore writes "
                          "the KV pools from rank 0 only)")
    logger.info(f"multi-host: rank {kw['node_rank']} of {kw['nnodes']} joining {kw['dist_init_addr']}")
    multihost.initialize(kw["dist_init_addr"], kw["nnodes"], kw["node_rank"])


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m jaxserve.launch_server`; returns the exit status."""
    started = time.monotonic()
    try:
        args = with_random_seed(parse_launch_args(argv))
    except UnsupportedFlagError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    server_log.configure_logging("error" if args.log_level == "error" else
                                 "debug" if args.log_level == "debug" else "info")
    if args.attention_choice is not None:
        kind = "warning" if args.attention_choice.fallback else "note"
        print(f"{kind}: {args.attention_choice.message}", file=sys.stderr)
    kw = args.engine_kwargs
    nnodes, rank = kw.get("nnodes", 1), kw.get("node_rank", 0)
    try:
        if nnodes > 1:
            start_multihost(args)
        logger.info(setup_compilation_cache(args))
        compile_log = compile_cache.CompileLog().install()
        sock = bind_socket(args.host, args.port) if rank == 0 else None
        from jaxserve.engine.runner import enable_background_compiles

        if nnodes == 1:  # multi-host: every process must run the same executable, never a padded fallback
            enable_background_compiles()  # a step never waits for its bucket's compile if one is built
        engine = build_engine(args)
    except (LaunchError, ValueError, TypeError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if rank > 0:
        ready_s = time.monotonic() - started
        logger.info(f"multi-host follower {rank}/{nnodes}: engine ready after {ready_s:.1f} s, following "
                    f"rank 0's steps")
        count = engine.follow()
        logger.info(f"multi-host follower {rank}/{nnodes}: stopped by rank 0 after {count} operations")
        return 0
    import uvicorn

    from jaxserve.server import cache_snapshot
    from jaxserve.server.app import create_app

    try:
        logger.info(f"primed the first request's programs in {warmup.prime(engine, engine.vocab_size):.1f} s")
    except Exception as exc:  # e.g. weights that load but do not fit together: refuse to serve, one line
        print(f"error: the engine could not run a first request: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return 1
    if args.cache_snapshot is not None:  # after priming, which flushes the cache
        cache_snapshot.restore(engine, args.cache_snapshot)  # logs what it restored, or why it starts cold
    port = sock.getsockname()[1]
    app = create_app(engine, served_model_name=args.served_model_name, tokenizer_path=args.tokenizer_path,
                     api_key=args.api_key, launch_info={"host": args.host, "port": port},
                     metrics_prefix=args.metrics_prefix, log_interval=args.decode_log_interval,
                     log_requests=args.log_requests, compile_log=compile_log,
                     warmup=bool(args.engine_kwargs.get("warmup", False)),
                     cache_snapshot=args.cache_snapshot)
    loop = app.state.server.loop
    logger.info(f"engine ready after {time.monotonic() - started:.1f} s ({compile_log.num_compiles} "
                f"compiles, {compile_log.num_cache_hits} persistent cache hits); random seed "
                f"{engine.args.random_seed}")
    config = uvicorn.Config(app, log_level=args.log_level, timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
                            access_log=args.log_level in ("debug", "info"))
    server = _make_server(config, on_first_exit=loop.abort_all)
    asyncio.run(_serve(server, sock, banner(args.host, port, args.api_key)))
    if args.cache_snapshot is not None:  # the engine thread has stopped: the tree is quiescent
        try:
            saved = cache_snapshot.save(engine, args.cache_snapshot)
        except cache_snapshot.SnapshotRefused as e:  # a request still held the tree: keep the last snapshot
            logger.warning(f"cache snapshot: not saved at shutdown ({e}); {args.cache_snapshot} keeps the "
                           f"previous one")
        else:
            logger.info(f"cache snapshot: saved {saved.num_nodes} nodes, {saved.num_slots} KV slots to "
                        f"{args.cache_snapshot}")
    engine.shutdown()  # multi-host: the followers leave their loops (nothing on a single process)
    logger.info(server_log.shutdown_line(num_finished=loop.num_finished, num_aborted=loop.num_aborted,
                                         uptime_s=time.monotonic() - started))
    from jaxserve.engine.runner import stop_background_compiles

    if not stop_background_compiles(timeout_s=COMPILE_STOP_S):  # a compile cannot be cut short: leave now
        logger.info("shutdown: leaving a background compile unfinished")
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0
