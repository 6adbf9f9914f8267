"""Exceptions raised by `jaxserve.engine` for requests a user can fix (each message says what to change)."""

from __future__ import annotations


class EngineError(Exception):
    """Base class of the engine's errors."""


class InvalidRequestError(EngineError, ValueError):
    """A request is malformed: empty prompt, token ids outside the vocabulary, both or neither of
    `prompt` / `input_ids`, mismatched batch lengths, or text given to an engine without a tokenizer."""


class PromptTooLongError(InvalidRequestError):
    """The prompt leaves no room for a single new token within the model's context length."""


class RequestTooLargeError(InvalidRequestError):
    """prompt + max_new_tokens needs more KV pages than the whole pool holds: it could never run, even
    alone. Raise `max_total_tokens` or lower `max_new_tokens`."""


class UnknownRequestError(EngineError, KeyError):
    """No live or finished request has this id."""


class EngineBusyError(EngineError, RuntimeError):
    """The operation needs an idle engine (e.g. `flush_cache` while requests are queued or running)."""


class SchedulerStuckError(EngineError, RuntimeError):
    """Internal: the scheduler could make no progress although the pool should fit the queue (a bug)."""
