"""Chat templates: the `chat_template` of a checkpoint's tokenizer_config.json, rendered with jinja2 in a
sandbox (the variables HF templates expect: messages, add_generation_prompt, bos_token, eos_token,
raise_exception, strftime_now)."""

from __future__ import annotations

import datetime
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from jaxserve.server.errors import APIError


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


class ChatTemplate:
    """A compiled template. `source` is the template string, or the list of named templates some configs
    carry (the one named "default" is used)."""

    def __init__(self, source: str | list[dict[str, str]], *, bos_token: str | None, eos_token: str | None):
        if isinstance(source, list):
            named = {t.get("name"): t.get("template") for t in source}
            source = named.get("default") or next(iter(named.values()))
        self.source = source
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
        self._template = env.from_string(source)
        self._specials = {"bos_token": bos_token or "", "eos_token": eos_token or ""}

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               **variables: Any) -> str:
        """The prompt text for `messages`; `variables` are further template variables (HF's names: `tools`,
        `reasoning_effort`, ...). A template error (e.g. roles out of order) raises APIError 400."""
        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         **self._specials, **variables)
        except TemplateError as exc:
            raise APIError(400, f"the chat template rejected the messages: {exc}") from exc


def chat_template_for(tokenizer) -> ChatTemplate | None:
    """The tokenizer's template (`HFTokenizer.chat_template`), or None when it has none."""
    source = getattr(tokenizer, "chat_template", None) if tokenizer is not None else None
    if not source:
        return None
    return ChatTemplate(source, bos_token=getattr(tokenizer, "bos_token", None),
                        eos_token=getattr(tokenizer, "eos_token", None))
