"""Request bodies (pydantic, unknown fields rejected) of `/generate` and the OpenAI-style `/v1` routes.

Only shapes are checked here (types, required fields, lengths); values that need the model (token ids in the
vocabulary, prompt length, sampling ranges) are checked by the engine, whose errors become HTTP 400.
`sampling_params` stays a dict so that the engine's `SamplingParams.from_dict` names unknown keys itself.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    model_validator,
)

MAX_BATCH = 256  # prompts per /generate request


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GenerateRequest(_Strict):
    """SGLang's `/generate`: `text` (a string or a list) or `input_ids` (a list of ids or a list of lists);
    `sampling_params` (one dict, or one per prompt); `stream` (SSE; single prompt only)."""

    text: StrictStr | list[StrictStr] | None = None
    input_ids: list[StrictInt] | list[list[StrictInt]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    stream: StrictBool = False
    rid: str | None = None  # accepted for SGLang compatibility; the server names requests itself
    return_logprob: StrictBool = False
    image_data: None = None  # SGLang clients send null; images are not supported

    @model_validator(mode="after")
    def _one_input(self) -> GenerateRequest:
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("give exactly one of 'text' or 'input_ids'")
        items = self.prompts if self.text is not None else self.token_lists
        if not items:
            raise ValueError("the batch is empty")
        if len(items) > MAX_BATCH:
            raise ValueError(f"{len(items)} prompts in one request; at most {MAX_BATCH}")
        if self.stream and self.is_batch:
            raise ValueError("stream=true supports a single prompt only (not supported yet for a batch)")
        if isinstance(self.sampling_params, list) and len(self.sampling_params) != len(items):
            raise ValueError(f"{len(self.sampling_params)} sampling_params for {len(items)} prompts")
        return self

    @property
    def is_batch(self) -> bool:
        if self.text is not None:
            return isinstance(self.text, list)
        return bool(self.input_ids) and isinstance(self.input_ids[0], list)

    @property
    def prompts(self) -> list[str] | None:
        return None if self.text is None else self.text if isinstance(self.text, list) else [self.text]

    @property
    def token_lists(self) -> list[list[int]] | None:
        if self.input_ids is None:
            return None
        return self.input_ids if self.is_batch else [self.input_ids]

    def params_per_prompt(self) -> list[dict[str, Any]]:
        num = len(self.prompts or self.token_lists)
        params = self.sampling_params if isinstance(self.sampling_params, list) else \
            [self.sampling_params or {}] * num
        # null means "not set" (SGLang clients send e.g. "json_schema": null)
        params = [{k: v for k, v in p.items() if v is not None} for p in params]
        return [{**p, "return_logprob": True} if self.return_logprob else p for p in params]


class StreamOptions(_Strict):
    include_usage: StrictBool = False


class _OpenAISampling(_Strict):
    """Fields shared by /v1/completions and /v1/chat/completions (OpenAI names, SGLang extras)."""

    model: str | None = None
    temperature: StrictFloat | None = None
    top_p: StrictFloat | None = None
    top_k: StrictInt | None = None
    min_p: StrictFloat | None = None
    n: Literal[1] = 1
    stop: StrictStr | list[StrictStr] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    seed: StrictInt | None = None
    frequency_penalty: StrictFloat | None = None
    presence_penalty: StrictFloat | None = None
    repetition_penalty: StrictFloat | None = None
    stop_token_ids: list[StrictInt] | None = None
    ignore_eos: StrictBool | None = None
    skip_special_tokens: StrictBool | None = None
    user: str | None = None

    def sampling_params(self, max_new_tokens: int | None) -> dict[str, Any]:
        names = ("temperature", "top_p", "top_k", "min_p", "stop", "seed", "frequency_penalty",
                 "presence_penalty", "repetition_penalty", "stop_token_ids", "ignore_eos",
                 "skip_special_tokens")
        params = {name: getattr(self, name) for name in names if getattr(self, name) is not None}
        if max_new_tokens is not None:
            params["max_new_tokens"] = max_new_tokens
        return params


class CompletionRequest(_OpenAISampling):
    """`/v1/completions`: one prompt (text or token ids); `max_tokens` defaults to 16 as in OpenAI."""

    prompt: StrictStr | list[StrictInt] | list[StrictStr] | list[list[StrictInt]]
    max_tokens: StrictInt | None = 16
    echo: Literal[False] = False
    logprobs: None = None

    @model_validator(mode="after")
    def _single(self) -> CompletionRequest:
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], str | list):
            if len(p) != 1:
                raise ValueError("a list of prompts is not supported yet: send one prompt per request")
            self.prompt = p[0]
        return self


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None

    def text(self) -> str:
        """The message's text; content parts other than {"type": "text"} are rejected."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError(f"content part {part.get('type')!r} is not supported (text only)")
            parts.append(part["text"])
        return "".join(parts)


class ChatCompletionRequest(_OpenAISampling):
    """`/v1/chat/completions`: `messages` rendered with the model's chat template."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    logprobs: Literal[False] | None = None

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
