"""The HTTP server: SGLang's native routes and OpenAI's /v1 routes around one `Engine` (FastAPI + uvicorn).

Files: `args` (CLI flags with SGLang names, `--config` YAML), `launch` (engine + socket + uvicorn, signals),
`app` (create_app), `engine_loop` (the engine's own thread, fed by a queue; per-request asyncio queues),
`protocol` (pydantic bodies), `routes_native` (/generate, /health, /get_*_info, /flush_cache, /metrics),
`routes_openai` (/v1/*), `streaming` (SSE, disconnect -> abort), `chat_template`, `metrics` (Prometheus),
`middleware` (API key, body size limit), `errors` (JSON error shape and status mapping), `compile_cache`
(JAX's persistent compilation cache, per-compile log lines), `server_log` (the operator's log lines),
`warmup` (`--warmup` with synthetic requests while serving; the first request's programs primed at start).

    from jaxserve.api import Engine
    from jaxserve.server import create_app
    app = create_app(Engine(model_path="/ckpt"))   # any ASGI server; or: python -m jaxserve.launch_server
"""

from jaxserve.server.app import create_app

__all__ = ["create_app"]
