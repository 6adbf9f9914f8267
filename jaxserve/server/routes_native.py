"""SGLang's native routes: /generate, /health, /health_generate, /get_model_info, /get_server_info,
/flush_cache, /metrics, /abort_request.

`/generate` answers `{"text", "output_ids", "meta_info"}` (a list of them for a batch). `meta_info` has
id, prompt_tokens, completion_tokens, cached_tokens, spec_verify_ct (0 without speculative decoding),
finish_reason ({"type": "stop"|"length"|"abort", ...}) and e2e_latency (seconds). With `stream: true` it
sends SSE chunks whose `text` and `output_ids` are cumulative (SGLang's default), then `data: [DONE]`.
`n` in `sampling_params` (one dict) gives n results per prompt, prompt-major, each prompt prefilled once.
`max_new_tokens` above what the context leaves is capped to it (SGLang's rule); a request whose prompt +
max_new_tokens cannot fit the KV pool even alone is a 400.

Control-plane reads (/health, /get_model_info, /get_server_info, /metrics) never wait for the engine thread:
they read what it last published (`EngineLoop.snapshot`, the metrics registry).
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict

from jaxserve.server import grammars, parallel, streaming
from jaxserve.server.engine_loop import Event
from jaxserve.server.errors import APIError
from jaxserve.server.protocol import GenerateRequest

router = APIRouter()
HEALTH_GENERATE_TIMEOUT_S = 60.0


def _state(request: Request):
    return request.app.state.server


def generate_result(event: Event) -> dict:
    return {"text": event.text, "output_ids": event.output_ids, "meta_info": event.meta_info}


@router.post("/generate")
async def generate(body: GenerateRequest, request: Request):
    state = _state(request)
    if body.prompts is not None and not state.has_tokenizer:
        raise APIError(400, "this model has no tokenizer: send input_ids instead of text")
    params = body.params_per_prompt()
    await grammars.precompile(state.loop, params)
    if body.num_choices > 1:  # prefill once per prompt, then fork (see `parallel`)
        groups = await parallel.submit(state.loop, body.prompts, body.token_lists, params[0],
                                       body.num_choices, request)
        handles = [h for group in groups for h in group]
    else:
        handles = await state.loop.submit(body.prompts, body.token_lists, params)
    if body.stream:
        rid, events = handles[0]
        return StreamingResponse(_stream_generate(state.loop, rid, events), media_type="text/event-stream")
    results = await streaming.collect_all(state.loop, handles, request)
    out = [generate_result(e) for e in results]
    return out if body.is_batch or body.num_choices > 1 else out[0]


async def _stream_generate(loop, rid, events):
    text, ids = "", []
    async for event in streaming.iterate(loop, rid, events):
        text += event.delta_text
        ids += event.delta_ids
        yield streaming.sse({"text": text, "output_ids": ids, "meta_info": event.meta_info})
    yield streaming.DONE


@router.get("/health")
async def health(request: Request) -> Response:
    """200 while the engine thread runs (with `{"status": "warming", "compiled": k, "total": n}` while
    `--warmup` runs, requests being served meanwhile); 503 once it has died."""
    loop = _state(request).loop
    if not loop.healthy:
        return JSONResponse({"status": "unhealthy", "error": repr(loop.error)}, status_code=503)
    if loop.warmup is not None and not loop.warmup.finished:
        return JSONResponse(loop.warmup.status())
    return Response(status_code=200)


@router.get("/health_generate")
async def health_generate(request: Request) -> Response:
    """200 once the engine generates one token for a one-token prompt (through the queue, as any request);
    503 if the engine has died or the token does not come within `HEALTH_GENERATE_TIMEOUT_S`."""
    loop = _state(request).loop
    try:
        handles = await loop.submit(None, [[0]], [{"max_new_tokens": 1, "temperature": 0}])
        await asyncio.wait_for(streaming.collect_all(loop, handles, request), HEALTH_GENERATE_TIMEOUT_S)
    except (APIError, TimeoutError, RuntimeError) as exc:
        return JSONResponse({"status": "unhealthy", "error": repr(exc)}, status_code=503)
    return Response(status_code=200)


@router.get("/get_model_info")
async def get_model_info(request: Request) -> dict:
    state = _state(request)
    return {"model_path": state.model_path, "tokenizer_path": state.tokenizer_path, "is_generation": True,
            "served_model_name": state.served_model_name, "context_length": state.context_length,
            "has_chat_template": state.chat_template is not None}


@router.get("/get_server_info")
async def get_server_info(request: Request) -> dict:
    """Server args, gauges, and `memory` as of the engine's last step: slot accounting, and while nothing
    is live `check_memory`'s ownership proof (free / tree / live-request slots partition the pool;
    `checked: true`)."""
    state = _state(request)
    snapshot = state.loop.snapshot
    return {**state.server_info, "internal_states": [state.metrics.snapshot()],
            "memory": snapshot.get("memory", {}), "snapshot_time": snapshot.get("time")}


class AbortRequest(BaseModel):
    """Body of /abort_request: the id of a live request (meta_info.id of /generate)."""

    model_config = ConfigDict(extra="forbid")
    rid: str


@router.post("/abort_request")
async def abort_request(body: AbortRequest, request: Request) -> dict:
    """Abort a live request by id: its stream ends with finish_reason abort, its KV is freed. 404 when no
    live request has that id (unknown, or already finished)."""
    if not await _state(request).loop.abort_live(body.rid):
        raise APIError(404, f"no live request with rid {body.rid!r} (unknown or already finished)")
    return {"success": True, "rid": body.rid}


@router.api_route("/flush_cache", methods=["GET", "POST"])
async def flush_cache(request: Request) -> dict:
    """Drop every cached prefix. 409 while requests are running or waiting."""
    await _state(request).loop.call(lambda engine: engine.flush_cache())
    return {"success": True, "message": "Cache flushed."}


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(_state(request).metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
