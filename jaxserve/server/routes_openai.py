"""OpenAI-compatible routes: /v1/models (and /v1/models/{id}), /v1/completions, /v1/chat/completions
(streaming over SSE with incremental deltas, `data: [DONE]` last; `stream_options.include_usage` adds a
usage chunk), and the tokenizer routes /tokenize and /detokenize.

Chat prompts are the model's chat template (tokenizer_config.json) rendered over `messages` (with `tools`
and `reasoning_effort` as template variables), tokenized without adding special tokens (the template places
them); a model without a template answers 400. A model whose tokenizer has harmony's special tokens
(gpt-oss) answers with `content`, `reasoning_content` and `tool_calls` read from its output channels
(`harmony`); with `tools`, a model whose template writes `<tool_call>` blocks has them read into
`tool_calls` (`tool_calls`); otherwise the text is the `content`. `tool_choice` "required" or a named
function is enforced by a grammar over the model's call format (`tool_choice`); it cannot be combined with
another grammar (`response_format`, `json_schema`, `regex`, `ebnf`).
`n` choices per prompt share its prefill (`parallel`); a list of prompts in /v1/completions gives
`len(prompts) * n` choices, prompt-major. Logprobs are of the model's raw distribution
(`jaxserve.sampling.logprobs`). Usage counts every prompt once and every choice's output.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from jaxserve.sampling.params import GRAMMAR_KINDS
from jaxserve.server import grammars, harmony, openai_logprobs, parallel, streaming, tool_calls, tool_choice
from jaxserve.server.engine_loop import Event
from jaxserve.server.errors import APIError
from jaxserve.server.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)

router = APIRouter()


def _finish_reason(meta: dict) -> str | None:
    reason = meta.get("finish_reason")
    return None if reason is None else reason.get("type")


def _usage(metas: list[dict], n: int) -> dict:
    prompt = sum(m["prompt_tokens"] for m in metas[::n])
    completion = sum(m["completion_tokens"] for m in metas)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(m["cached_tokens"] for m in metas[::n])}}


def _model_card(state) -> dict:
    return {"id": state.served_model_name, "object": "model", "created": state.created,
            "owned_by": "jaxserve", "root": state.model_path, "max_model_len": state.context_length}


@router.get("/v1/models")
async def models(request: Request) -> dict:
    return {"object": "list", "data": [_model_card(request.app.state.server)]}


@router.get("/v1/models/{model_id:path}")
async def model(model_id: str, request: Request) -> dict:
    state = request.app.state.server
    if model_id != state.served_model_name:
        raise APIError(404, f"model {model_id!r} does not exist; this server serves "
                            f"{state.served_model_name!r}")
    return _model_card(state)


async def _params(state, body, max_new_tokens: int | None,
                  grammar: dict[str, str] | None = None) -> dict[str, Any]:
    """The request's sampling params, its grammar (if any; `grammar` is the tool choice's) compiled off the
    engine thread."""
    try:
        params = body.sampling_params(max_new_tokens)
    except ValueError as exc:
        raise APIError(400, str(exc)) from exc
    if grammar:
        if any(k in params for k in GRAMMAR_KINDS):
            raise APIError(400, "tool_choice 'required' or a named function cannot be combined with "
                                "response_format, json_schema, regex, ebnf or lark")
        params.update(grammar)
    await grammars.precompile(state.loop, [params])
    return params


def _tool_grammar(state, body: ChatCompletionRequest) -> dict[str, str]:
    """{"lark": source} enforcing a "required" or named `tool_choice` (compiled by llguidance whatever the
    grammar backend); {} for the other choices."""
    try:
        tools = tool_choice.chosen_tools(body.tools, required=body.tool_choice == "required",
                                         name=body.forced_tool)
    except ValueError as exc:
        raise APIError(400, str(exc)) from exc
    if not tools:
        return {}
    if harmony.is_harmony(state.loop.engine.tokenizer):
        return {"lark": tool_choice.harmony_grammar(tools)}
    if tool_calls.uses_tool_call_tags(state.chat_template.source):
        return {"lark": tool_choice.tag_grammar(tools, parallel=body.parallel_tool_calls is not False)}
    raise APIError(400, "tool_choice 'required' or a named function needs a model that writes tool calls "
                        "(a harmony model, or a chat template with <tool_call> blocks); this one does not")


def _tokenizer(state):
    tokenizer = state.loop.engine.tokenizer
    if tokenizer is None:
        raise APIError(400, "this model has no tokenizer: send token ids")
    return tokenizer


def _rendered_chat(state, messages: list[ChatMessage], variables: dict[str, Any] | None = None) -> str:
    if state.chat_template is None:
        raise APIError(400, "this model has no chat template (tokenizer_config.json 'chat_template'); "
                            "use /v1/completions or /generate with a raw prompt")
    try:
        rendered = [m.template_dict() for m in messages]
    except ValueError as exc:
        raise APIError(400, str(exc)) from exc
    return state.chat_template.render(rendered, add_generation_prompt=True, **(variables or {}))


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request):
    state = request.app.state.server
    prompts = body.prompts
    is_text = isinstance(prompts[0], str)
    if is_text and not state.has_tokenizer:
        raise APIError(400, "this model has no tokenizer: send the prompt as token ids")
    params = await _params(state, body, body.max_tokens)
    echoes = [""] * len(prompts)
    if body.echo:  # before submitting: a 400 here leaves nothing running
        tokenizer = _tokenizer(state)
        echoes = [p if is_text else tokenizer.decode(p, skip_special_tokens=False) for p in prompts]
    handles = await parallel.submit(state.loop, prompts if is_text else None, None if is_text else prompts,
                                    params, body.candidates, request)
    reply = _Reply(state, body, chat=False, echoes=[e for e in echoes for _ in range(body.n)])
    return await reply.respond([h for per_prompt in handles for h in per_prompt], request,
                               best_of=body.candidates)


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request):
    state = request.app.state.server
    text = _rendered_chat(state, body.messages, body.template_variables())
    params = await _params(state, body, body.max_new_tokens, _tool_grammar(state, body))
    if harmony.is_harmony(state.loop.engine.tokenizer):
        params["skip_special_tokens"] = False  # the channels are read from the special tokens
    ids = await state.loop.call(lambda engine: engine.tokenizer.encode(text, add_special_tokens=False))
    [handles] = await parallel.submit(state.loop, None, [ids], params, body.n, request)
    return await _Reply(state, body, chat=True, echoes=[""] * body.n).respond(handles, request)


class _Reply:
    """Builds one OpenAI response (or stream) over a request's choices."""

    def __init__(self, state, body, *, chat: bool, echoes: list[str]) -> None:
        self.state, self.body, self.chat, self.echoes = state, body, chat, echoes
        self.head = {"id": ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex, "created": int(time.time()),
                     "model": body.model or state.served_model_name}
        self.with_logprobs = bool(body.logprobs) if chat else body.logprobs is not None
        self.parse = None  # reads content / reasoning_content / tool_calls out of a chat answer
        if chat and harmony.is_harmony(state.loop.engine.tokenizer):
            self.parse = harmony.parse
        elif chat and body.tools and body.tool_choice != "none" and tool_calls.uses_tool_call_tags(
                state.chat_template.source):
            self.parse = tool_calls.parse
        self._texts: dict[int, str] = {}

    def token_text(self, token_id: int) -> str:
        if token_id not in self._texts:
            tokenizer = self.state.loop.engine.tokenizer
            self._texts[token_id] = tokenizer.decode([token_id], skip_special_tokens=False)
        return self._texts[token_id]

    def logprobs(self, meta: dict, start: int, stop: int | None, offset: int, *,
                 prompt: bool = False) -> dict | None:
        """Logprobs of output tokens [start, stop), after the prompt's own (`prompt`: echo)."""
        if not self.with_logprobs:
            return None
        items = openai_logprobs.entries(meta, start, stop)
        if prompt:
            items = openai_logprobs.prompt_entries(meta) + items
        if self.chat:
            return openai_logprobs.chat_logprobs(items, self.token_text)
        return openai_logprobs.completion_logprobs(items, self.token_text, offset)

    async def respond(self, handles: list[parallel.Handle], request: Request, *, best_of: int = 0):
        """The response over `handles`: prompt-major, `best_of` choices per prompt (0: n). With more than
        n, each prompt's n best are returned (`parallel.best`); such a request is never streamed."""
        if self.body.stream:
            return StreamingResponse(self._stream(handles), media_type="text/event-stream")
        n = self.body.n
        every = await streaming.collect_all(self.state.loop, handles, request)
        per = best_of or n
        usage = _usage([e.meta_info for e in every], per)
        events = every if per == n else [
            group[i] for group in (every[k:k + per] for k in range(0, len(every), per))
            for i in parallel.best([e.meta_info for e in group], n)]
        choices = []
        for index, event in enumerate(events):
            meta, reason = event.meta_info, _finish_reason(event.meta_info)
            echo = self.echoes[index]
            logprobs = self.logprobs(meta, 0, None, 0, prompt=bool(echo))
            if self.parse is not None:
                parsed = self.parse(event.text, finished=True)
                reason = "tool_calls" if parsed.tool_calls else reason
                choices.append({"index": index, "message": _assistant_message(parsed), "logprobs": logprobs,
                                "finish_reason": reason})
            elif self.chat:
                choices.append({"index": index, "message": {"role": "assistant", "content": event.text},
                                "logprobs": logprobs, "finish_reason": reason})
            else:
                choices.append({"index": index, "text": echo + event.text, "logprobs": logprobs,
                                "finish_reason": reason})
        return {**self.head, "object": "chat.completion" if self.chat else "text_completion",
                "choices": choices, "usage": usage}

    def _chunk(self, index: int, text: str | None, reason: str | None, logprobs: dict | None, *,
               role: bool = False) -> str:
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text else {})
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
        else:
            choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": reason}
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return streaming.sse({**self.head, "object": kind, "choices": [choice]})

    async def _stream(self, handles: list[parallel.Handle]):
        sent = [0] * len(handles)  # output tokens whose logprobs were sent
        texts = [""] * len(handles)  # with a parser: each choice's output so far, parsed at every event
        shown = [harmony.Parsed() for _ in handles]  # with a parser: what was sent of it
        offsets = [len(e) for e in self.echoes]
        finals: list[dict | None] = [None] * len(handles)
        # with logprobs, an echo waits for the prompt's logprobs (they come with the first event)
        held_echoes = {i for i, e in enumerate(self.echoes) if e and self.with_logprobs}
        for index in range(len(handles)):
            if self.chat:
                yield self._chunk(index, None, None, None, role=True)
            elif self.echoes[index] and index not in held_echoes:
                yield self._chunk(index, self.echoes[index], None, None)
        async for index, event in parallel.merge(self.state.loop, handles):
            event: Event
            if index in held_echoes:
                held_echoes.discard(index)
                prompt = openai_logprobs.completion_logprobs(openai_logprobs.prompt_entries(event.meta_info),
                                                             self.token_text, 0)
                yield self._chunk(index, self.echoes[index], None, prompt)
            num_ids = event.meta_info["completion_tokens"]
            if not (event.delta_text or event.finished or (self.with_logprobs and num_ids > sent[index])):
                continue
            logprobs = self.logprobs(event.meta_info, sent[index], num_ids, offsets[index])
            sent[index] = num_ids
            offsets[index] += len(event.delta_text)
            if event.finished:
                finals[index] = event.meta_info
            reason = _finish_reason(event.meta_info) if event.finished else None
            if self.parse is not None:
                texts[index] += event.delta_text
                parsed = self.parse(texts[index], finished=event.finished)
                delta = _assistant_delta(shown[index], parsed)
                shown[index] = parsed
                reason = "tool_calls" if reason and parsed.tool_calls else reason
                yield streaming.sse({**self.head, "object": "chat.completion.chunk", "choices": [
                    {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}]})
                continue
            yield self._chunk(index, event.delta_text, reason, logprobs)
        usage = self.body.stream_options is not None and self.body.stream_options.include_usage
        if usage and all(f is not None for f in finals):
            yield streaming.sse({**self.head, "object": "chat.completion.chunk" if self.chat else
                                 "text_completion", "choices": [], "usage": _usage(finals, self.body.n)})
        yield streaming.DONE


def _tool_call(call: harmony.ToolCall, index: int | None = None) -> dict:
    out = {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
           "function": {"name": call.name, "arguments": call.arguments}}
    return out if index is None else {"index": index, **out}


def _assistant_message(parsed: harmony.Parsed) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content or None,
                               "reasoning_content": parsed.reasoning_content or None}
    if parsed.tool_calls:
        message["tool_calls"] = [_tool_call(c) for c in parsed.tool_calls]
    return message


def _assistant_delta(before: harmony.Parsed, now: harmony.Parsed) -> dict:
    """What `now` adds to `before` (the text fields only grow; new complete tool calls)."""
    delta: dict[str, Any] = {}
    if len(now.content) > len(before.content):
        delta["content"] = now.content[len(before.content):]
    if len(now.reasoning_content) > len(before.reasoning_content):
        delta["reasoning_content"] = now.reasoning_content[len(before.reasoning_content):]
    if len(now.tool_calls) > len(before.tool_calls):
        delta["tool_calls"] = [_tool_call(c, i) for i, c in enumerate(now.tool_calls)
                               if i >= len(before.tool_calls)]
    return delta


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request) -> dict:
    """{"tokens", "count", "max_model_len"}; `messages` are rendered with the chat template first (then no
    special tokens are added: the template places them)."""
    state = request.app.state.server
    tokenizer = _tokenizer(state)
    if body.messages is not None:
        text, special = _rendered_chat(state, body.messages), False
    else:
        text, special = body.prompt, body.add_special_tokens
    ids = await state.loop.call(lambda engine: tokenizer.encode(text, add_special_tokens=special))
    return {"tokens": ids, "count": len(ids), "max_model_len": state.context_length}


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request) -> dict:
    state = request.app.state.server
    tokenizer = _tokenizer(state)
    vocab_size = state.server_info["vocab_size"]
    bad = [t for t in body.tokens if not 0 <= t < vocab_size]
    if bad:
        raise APIError(400, f"token ids {bad[:8]} are outside the vocabulary [0, {vocab_size})")
    text = await state.loop.call(lambda engine: tokenizer.decode(body.tokens,
                                                                 skip_special_tokens=body.skip_special_tokens))
    return {"text": text}
