"""`create_app(engine, ...)`: the FastAPI application around one `Engine`.

The app owns an `EngineLoop` (the engine's thread), started when the app starts (lifespan) and stopped
when it shuts down (live requests aborted). Middleware order, outermost first: API key (401), body size
limit (413), form-encoded bodies read as JSON, then routing with pydantic-validated bodies (400 on bad
input; see `errors`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from typing import Any

from fastapi import FastAPI

from jaxserve.api import Engine
from jaxserve.server.chat_template import ChatTemplate, chat_template_for
from jaxserve.server.compile_cache import CompileLog
from jaxserve.server.engine_loop import EngineLoop
from jaxserve.server.errors import install_error_handlers
from jaxserve.server.metrics import ServerMetrics
from jaxserve.server.middleware import DEFAULT_MAX_BODY_BYTES, ApiKeyAuth, BodySizeLimit, JsonBodies
from jaxserve.server.warmup import Warmup, plan_shapes


@dataclasses.dataclass
class ServerState:
    """What routes read from `app.state.server`."""

    loop: EngineLoop
    metrics: ServerMetrics
    model_path: str
    tokenizer_path: str
    served_model_name: str
    context_length: int  # the longest prompt + output a request can have: the model's, capped by the pool
    chat_template: ChatTemplate | None
    server_info: dict[str, Any]
    has_tokenizer: bool
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))


def create_app(engine: Engine, *, served_model_name: str | None = None, tokenizer_path: str | None = None,
               api_key: str | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               launch_info: dict[str, Any] | None = None, metrics_prefix: str = "sglang",
               log_interval: int = 40, log_requests: bool = False,
               compile_log: CompileLog | None = None, warmup: bool = False,
               cache_snapshot: str | None = None) -> FastAPI:
    """An ASGI app serving `engine` (which the app's engine thread then owns: do not call it elsewhere).
    `launch_info` is merged into /get_server_info (e.g. the HTTP settings); `metrics_prefix` names the
    Prometheus metrics (`sglang` or `jaxserve`); `log_interval`, `log_requests`, `compile_log`: see
    `EngineLoop`; `warmup`: compile the step programs on the background compile thread while
    serving (see `server.warmup`); `cache_snapshot`: the `--cache-snapshot` directory `POST /save_cache`
    writes (None: the route answers 400)."""
    from jaxserve.server import routes_native, routes_openai, routes_snapshot

    model_path = str(engine.args.model_path or "<in-memory model>")
    metrics = ServerMetrics(model_name=served_model_name or model_path, prefix=metrics_prefix)
    plan = Warmup(plan_shapes(engine)) if warmup else None
    loop = EngineLoop(engine, metrics, log_interval=log_interval, log_requests=log_requests,
                      compile_log=compile_log, warmup=plan)
    info = {**dataclasses.asdict(engine.args), **(launch_info or {}), "context_length": engine.context_length,
            "max_request_tokens": engine.kv.max_request_tokens, "vocab_size": engine.vocab_size,
            "version": _version()}
    state = ServerState(loop=loop, metrics=metrics, model_path=model_path,
                        tokenizer_path=str(tokenizer_path or model_path),
                        served_model_name=served_model_name or model_path,
                        context_length=min(engine.context_length, engine.kv.max_request_tokens),
                        chat_template=chat_template_for(engine.tokenizer),
                        server_info=info, has_tokenizer=engine.tokenizer is not None)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        loop.start(asyncio.get_running_loop())
        try:
            yield
        finally:
            await asyncio.get_running_loop().run_in_executor(None, loop.stop)

    app = FastAPI(title="jaxserve", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.server = state
    app.state.cache_snapshot = cache_snapshot
    install_error_handlers(app)
    app.include_router(routes_native.router)
    app.include_router(routes_openai.router)
    app.include_router(routes_snapshot.router)
    app.add_middleware(JsonBodies)
    app.add_middleware(BodySizeLimit, max_body_bytes=max_body_bytes)
    if api_key:
        app.add_middleware(ApiKeyAuth, api_key=api_key)  # added last = outermost
    return app


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("jaxserve")
    except PackageNotFoundError:
        return "0.1.0+local"
