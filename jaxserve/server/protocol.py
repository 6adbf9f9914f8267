"""Request bodies (pydantic, unknown fields rejected) of `/generate` and the OpenAI-style `/v1` routes.

Only shapes are checked here (types, required fields, lengths); values that need the model (token ids in the
vocabulary, prompt length, sampling ranges) are checked by the engine, whose errors become HTTP 400.
`sampling_params` stays a dict so that the engine's `SamplingParams.from_dict` names unknown keys itself.
"""

from __future__ import annotations

import json
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

from jaxserve.sampling.params import GRAMMAR_KINDS

MAX_BATCH = 256  # prompts (times n) per request
MAX_N = 64  # results per prompt (`n`)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GenerateRequest(_Strict):
    """SGLang's `/generate`: `text` (a string or a list) or `input_ids` (a list of ids or a list of lists);
    `sampling_params` (one dict, or one per prompt); `stream` (SSE; single prompt only); `return_logprob`
    with `top_logprobs_num` and `logprob_start_len` (-1: output tokens only, 0: the prompt's too)."""

    text: StrictStr | list[StrictStr] | None = None
    input_ids: list[StrictInt] | list[list[StrictInt]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    stream: StrictBool = False
    rid: str | None = None  # accepted for SGLang compatibility; the server names requests itself
    return_logprob: StrictBool = False
    top_logprobs_num: StrictInt = Field(default=0, ge=0, le=20)
    logprob_start_len: Literal[-1, 0] = -1  # 0: also every prompt token's logprob (input_token_logprobs)
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
        many = [p.get("n", 1) for p in self.sampling_params] if isinstance(self.sampling_params, list) else []
        if any(n != 1 for n in many):
            raise ValueError("n > 1 needs one sampling_params object for the whole batch, not a list")
        n = self.num_choices
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
            raise ValueError(f"sampling_params n={n!r}: expected an int in [1, {MAX_N}]")
        if n > 1 and self.stream:
            raise ValueError("stream=true supports n = 1 only")
        if n * len(items) > MAX_BATCH:
            raise ValueError(f"{len(items)} prompts x n={n} results; at most {MAX_BATCH}")
        return self

    @property
    def num_choices(self) -> int:
        """`n` of the (single) sampling_params object: results per prompt."""
        params = self.sampling_params
        return params.get("n", 1) if isinstance(params, dict) and params.get("n") is not None else 1

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
        params = [{k: v for k, v in p.items() if v is not None and k != "n"} for p in params]
        if not self.return_logprob:
            return params
        extra = {"return_logprob": True, "top_logprobs_num": self.top_logprobs_num,
                 **({"prompt_logprobs": True} if self.logprob_start_len == 0 else {})}
        return [{**p, **extra} for p in params]


class StreamOptions(_Strict):
    include_usage: StrictBool = False


class JsonSchemaFormat(_Strict):
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(_Strict):
    """OpenAI's `response_format`: text (no constraint), json_object (any JSON object), json_schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and (self.json_schema is None or self.json_schema.schema_ is None):
            raise ValueError("response_format json_schema needs json_schema.schema")
        return self

    def grammar(self) -> dict[str, str]:
        """The SGLang sampling parameter this format stands for ({} for text)."""
        if self.type == "json_object":
            return {"json_schema": json.dumps({"type": "object"})}
        if self.type == "json_schema":
            return {"json_schema": json.dumps(self.json_schema.schema_)}
        return {}


class _OpenAISampling(_Strict):
    """Fields shared by /v1/completions and /v1/chat/completions (OpenAI names, SGLang extras).

    `store`, `metadata`, `user` and `service_tier` are accepted and ignored (they change no output); any
    other unknown field is a 400. `n` choices share the prompt's prefill (see `parallel`)."""

    model: str | None = None
    temperature: StrictFloat | StrictInt | None = None
    top_p: StrictFloat | StrictInt | None = None
    top_k: StrictInt | None = None
    min_p: StrictFloat | StrictInt | None = None
    n: StrictInt = Field(default=1, ge=1, le=MAX_N)
    stop: StrictStr | list[StrictStr] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    seed: StrictInt | None = None
    frequency_penalty: StrictFloat | StrictInt | None = None
    presence_penalty: StrictFloat | StrictInt | None = None
    repetition_penalty: StrictFloat | StrictInt | None = None
    stop_token_ids: list[StrictInt] | None = None
    ignore_eos: StrictBool | None = None
    skip_special_tokens: StrictBool | None = None
    logit_bias: dict[str, StrictFloat | StrictInt] | None = None
    response_format: ResponseFormat | None = None
    json_schema: StrictStr | None = None  # SGLang's constrained decoding extras
    regex: StrictStr | None = None
    ebnf: StrictStr | None = None
    lark: StrictStr | None = None  # ours: llguidance's Lark format, whatever the grammar backend
    # accepted and ignored
    user: str | None = None
    store: StrictBool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None

    def sampling_params(self, max_new_tokens: int | None) -> dict[str, Any]:
        """The engine's sampling params for one choice (logprob fields are added by each request kind)."""
        names = ("temperature", "top_p", "top_k", "min_p", "stop", "seed", "frequency_penalty",
                 "presence_penalty", "repetition_penalty", "stop_token_ids", "ignore_eos",
                 "skip_special_tokens", "logit_bias", *GRAMMAR_KINDS)
        params = {name: getattr(self, name) for name in names if getattr(self, name) is not None}
        if self.response_format is not None:
            grammar = self.response_format.grammar()
            if grammar and any(k in params for k in GRAMMAR_KINDS):
                raise ValueError(f"give response_format or one of {' / '.join(GRAMMAR_KINDS)}, not both")
            params.update(grammar)
        if max_new_tokens is not None:
            params["max_new_tokens"] = max_new_tokens
        return params


class CompletionRequest(_OpenAISampling):
    """`/v1/completions`: one prompt or a list (text or token ids; n choices each, in prompt-major order);
    `max_tokens` defaults to 16 as in OpenAI. `logprobs: k` reports each token's logprob and the k most
    likely ones; `echo` prepends the prompt to the text (with `logprobs`, the prompt tokens' logprobs come
    first: the first token's is null). `best_of` (>= n, not streamed when > n): that many candidates per
    prompt are sampled (the prompt prefilled once, as for `n`), and the n with the highest mean logprob
    per output token are returned, best first; usage counts every candidate's tokens."""

    prompt: StrictStr | list[StrictInt] | list[StrictStr] | list[list[StrictInt]]
    max_tokens: StrictInt | None = 16
    echo: StrictBool = False
    logprobs: StrictInt | None = Field(default=None, ge=0, le=20)
    best_of: StrictInt | None = Field(default=None, ge=1, le=MAX_N)

    @model_validator(mode="after")
    def _check(self) -> CompletionRequest:
        if not self.prompts:
            raise ValueError("the prompt list is empty")
        if self.best_of is not None and self.best_of < self.n:
            raise ValueError(f"best_of={self.best_of} must be at least n={self.n}")
        if len(self.prompts) * self.candidates > MAX_BATCH:
            raise ValueError(f"{len(self.prompts)} prompts x {self.candidates} choices; at most {MAX_BATCH}")
        if self.stream and self.candidates > self.n:
            raise ValueError("best_of > n cannot be streamed (the best choices are known only at the end)")
        return self

    @property
    def candidates(self) -> int:
        """Choices sampled per prompt: `best_of` when given, else `n`."""
        return self.n if self.best_of is None else self.best_of

    @property
    def prompts(self) -> list[str] | list[list[int]]:
        """One entry per prompt: a string or a list of token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and isinstance(p[0], str | list):
            return list(p)
        return [p]

    def sampling_params(self, max_new_tokens: int | None) -> dict[str, Any]:
        params = super().sampling_params(max_new_tokens)
        if self.logprobs is not None:
            params.update(return_logprob=True, top_logprobs_num=self.logprobs)
            if self.echo:
                params["prompt_logprobs"] = True
        elif self.candidates > self.n:  # the ranking reads each token's logprob (not returned)
            params.update(return_logprob=True, top_logprobs_num=0)
        return params


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool message answers this call
    reasoning_content: str | None = None  # an assistant's earlier reasoning (harmony's analysis channel)

    def template_dict(self) -> dict[str, Any]:
        """The message as chat templates read it (HF's keys; gpt-oss's template calls reasoning `thinking`
        and a tool call's arguments a JSON string or object)."""
        out: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.name:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        if self.reasoning_content:
            out["thinking"] = self.reasoning_content
        return out

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


class FunctionName(_Strict):
    name: StrictStr


class NamedToolChoice(_Strict):
    """`tool_choice` naming the one function the answer must call."""

    type: Literal["function"]
    function: FunctionName


class ChatCompletionRequest(_OpenAISampling):
    """`/v1/chat/completions`: `messages` rendered with the model's chat template. `logprobs` reports each
    token's logprob, `top_logprobs` (0..20) the most likely tokens at each step."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    # every call the model makes is returned; false limits a forced tool_choice to one call
    parallel_tool_calls: StrictBool | None = None
    reasoning_effort: Literal["low", "medium", "high"] | None = None

    @model_validator(mode="after")
    def _check(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    @property
    def forced_tool(self) -> str | None:
        """The function a named `tool_choice` requires (None for the string choices)."""
        return self.tool_choice.function.name if isinstance(self.tool_choice, NamedToolChoice) else None

    def template_variables(self) -> dict[str, Any]:
        """`tools` (unless tool_choice is "none") and `reasoning_effort` for the chat template."""
        out: dict[str, Any] = {}
        if self.tools and self.tool_choice != "none":
            out["tools"] = self.tools
        if self.reasoning_effort is not None:
            out["reasoning_effort"] = self.reasoning_effort
        return out

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def sampling_params(self, max_new_tokens: int | None) -> dict[str, Any]:
        params = super().sampling_params(max_new_tokens)
        if self.logprobs:
            params.update(return_logprob=True, top_logprobs_num=self.top_logprobs or 0)
        return params


class TokenizeRequest(_Strict):
    """`/tokenize`: `prompt` text (or chat `messages`, rendered with the template) -> token ids."""

    prompt: StrictStr | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: StrictBool = True
    model: str | None = None

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of 'prompt' or 'messages'")
        return self


class DetokenizeRequest(_Strict):
    """`/detokenize`: token ids -> text."""

    tokens: list[StrictInt]
    model: str | None = None
    skip_special_tokens: StrictBool = True
