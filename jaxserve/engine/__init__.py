"""The serving engine: scheduler (continuous batching, chunked prefill, radix reuse, retraction), model
runner (one jitted forward + sampling step over donated pools) and the offline `Engine` API."""

from jaxserve.engine.config import ServerArgs
from jaxserve.engine.engine import Engine
from jaxserve.engine.errors import (
    EngineBusyError,
    EngineError,
    InvalidRequestError,
    PromptTooLongError,
    RequestTooLargeError,
    SchedulerStuckError,
    UnknownRequestError,
)

__all__ = [
    "Engine",
    "EngineBusyError",
    "EngineError",
    "InvalidRequestError",
    "PromptTooLongError",
    "RequestTooLargeError",
    "SchedulerStuckError",
    "ServerArgs",
    "UnknownRequestError",
]
