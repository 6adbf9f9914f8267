"""OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions (streaming over SSE with
incremental deltas, `data: [DONE]` last; `stream_options.include_usage` adds a usage chunk).

Chat prompts are the model's chat template (tokenizer_config.json) rendered over `messages`, tokenized
without adding special tokens (the template places them); a model without a template answers 400.
"""

from __future__ import annotations

import time
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from jaxserve.server import streaming
from jaxserve.server.engine_loop import Event
from jaxserve.server.errors import APIError
from jaxserve.server.protocol import ChatCompletionRequest, CompletionRequest

router = APIRouter(prefix="/v1")


def _finish_reason(meta: dict) -> str | None:
    reason = meta.get("finish_reason")
    return None if reason is None else reason.get("type")


def _usage(meta: dict) -> dict:
    return {"prompt_tokens": meta["prompt_tokens"], "completion_tokens": meta["completion_tokens"],
            "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"],
            "prompt_tokens_details": {"cached_tokens": meta["cached_tokens"]}}


@router.get("/models")
async def models(request: Request) -> dict:
    state = request.app.state.server
    return {"object": "list", "data": [{"id": state.served_model_name, "object": "model",
                                        "created": state.created, "owned_by": "jaxserve",
                                        "root": state.model_path, "max_model_len": state.context_length}]}


@router.post("/completions")
async def completions(body: CompletionRequest, request: Request):
    state = request.app.state.server
    if isinstance(body.prompt, str):
        if not state.has_tokenizer:
            raise APIError(400, "this model has no tokenizer: send the prompt as token ids")
        prompts, ids = [body.prompt], None
    else:
        prompts, ids = None, [body.prompt]
    params = body.sampling_params(body.max_tokens)
    [(rid, events)] = await state.loop.submit(prompts, ids, [params])
    return await _respond(state, body, request, rid, events, chat=False)


@router.post("/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request):
    state = request.app.state.server
    if state.chat_template is None:
        raise APIError(400, "this model has no chat template (tokenizer_config.json 'chat_template'); "
                            "use /v1/completions or /generate with a raw prompt")
    try:
        messages = [{"role": m.role, "content": m.text(), **({"name": m.name} if m.name else {})}
                    for m in body.messages]
    except ValueError as exc:
        raise APIError(400, str(exc)) from exc
    text = state.chat_template.render(messages, add_generation_prompt=True)
    ids = await state.loop.call(lambda engine: engine.tokenizer.encode(text, add_special_tokens=False))
    [(rid, events)] = await state.loop.submit(None, [ids], [body.sampling_params(body.max_new_tokens)])
    return await _respond(state, body, request, rid, events, chat=True)


async def _respond(state, body, request: Request, rid: str, events, *, chat: bool):
    head = {"id": ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex, "created": int(time.time()),
            "model": body.model or state.served_model_name}
    if body.stream:
        usage = body.stream_options is not None and body.stream_options.include_usage
        return StreamingResponse(_stream(state.loop, rid, events, head, chat, usage),
                                 media_type="text/event-stream")
    event = await streaming.collect(state.loop, rid, events, request)
    reason = _finish_reason(event.meta_info)
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": event.text}, "logprobs": None,
                  "finish_reason": reason}
    else:
        choice = {"index": 0, "text": event.text, "logprobs": None, "finish_reason": reason}
    return {**head, "object": "chat.completion" if chat else "text_completion", "choices": [choice],
            "usage": _usage(event.meta_info)}


async def _stream(loop, rid: str, events, head: dict, chat: bool, include_usage: bool):
    kind = "chat.completion.chunk" if chat else "text_completion"

    def chunk(delta_text: str | None, reason: str | None, *, role: bool = False) -> str:
        if chat:
            delta = {"role": "assistant", "content": ""} if role else \
                ({"content": delta_text} if delta_text else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": delta_text or "", "logprobs": None, "finish_reason": reason}
        return streaming.sse({**head, "object": kind, "choices": [choice]})

    if chat:
        yield chunk(None, None, role=True)
    last: Event | None = None
    async for event in streaming.iterate(loop, rid, events):
        last = event
        if event.delta_text or event.finished:
            yield chunk(event.delta_text, _finish_reason(event.meta_info) if event.finished else None)
    if include_usage and last is not None:
        yield streaming.sse({**head, "object": kind, "choices": [], "usage": _usage(last.meta_info)})
    yield streaming.DONE
