"""Error responses: every failure is JSON `{"object": "error", "message", "type", "param", "code"}` (the
shape SGLang's OpenAI routes use; the `openai` client reads `message` from it).

Mapping: body validation (malformed JSON, wrong types, unknown fields) -> 400; the engine's
`InvalidRequestError` / `InvalidSamplingParamsError` (empty or over-long prompt, bad token ids, bad sampling
values, requests larger than the KV pool) -> 400; `EngineBusyError` -> 409; anything else -> 500 with the
exception's type (the server keeps running).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from jaxserve.engine import EngineBusyError, InvalidRequestError
from jaxserve.sampling.errors import InvalidSamplingParamsError

logger = logging.getLogger("jaxserve.server")

_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 405: "MethodNotAllowed",
          409: "ConflictError", 413: "RequestTooLargeError", 500: "InternalServerError",
          503: "ServiceUnavailableError"}


# FastAPI's detail when reading the body itself fails (not a JSON syntax error, which it reports itself)
_FASTAPI_BODY_ERROR = "There was an error parsing the body"


class APIError(Exception):
    """Raise in a route to answer `status` with `message`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def error_body(status: int, message: str) -> dict:
    return {"object": "error", "message": message, "type": _TYPES.get(status, "Error"), "param": None,
            "code": status}


def error_response(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message), status_code=status, headers=headers)


def status_of(exc: BaseException) -> int:
    """HTTP status for an exception raised while handling a request (see the module docstring)."""
    if isinstance(exc, APIError):
        return exc.status
    if isinstance(exc, InvalidRequestError | InvalidSamplingParamsError):
        return 400
    if isinstance(exc, EngineBusyError):
        return 409
    return 500


def describe(exc: BaseException) -> str:
    if status_of(exc) == 500:
        logger.exception("internal error", exc_info=exc)
        return f"internal error: {type(exc).__name__}: {exc}"
    return exc.message if isinstance(exc, APIError) else str(exc)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        if err.get("type") == "json_invalid":
            return f"malformed JSON body: {err.get('ctx', {}).get('error', err.get('msg'))}"
        if err.get("type") == "extra_forbidden":
            parts.append(f"unknown field '{where}'")
        else:
            parts.append(f"{where or 'body'}: {err.get('msg')}")
    return "invalid request: " + "; ".join(dict.fromkeys(parts))


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _on_validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(400, _validation_message(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _on_http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = str(exc.detail)
        if exc.status_code == 400 and message == _FASTAPI_BODY_ERROR:  # e.g. bytes that are not UTF-8
            message = "malformed JSON body: it could not be decoded as UTF-8 JSON"
        return error_response(exc.status_code, message, headers=getattr(exc, "headers", None))

    async def _on_known(_: Request, exc: Exception) -> JSONResponse:
        return error_response(status_of(exc), describe(exc))

    # Known errors are answered by the routing layer; a bare Exception handler (500) is also logged with
    # its traceback by Starlette's outermost middleware.
    for kind in (APIError, InvalidRequestError, InvalidSamplingParamsError, EngineBusyError, Exception):
        app.add_exception_handler(kind, _on_known)
