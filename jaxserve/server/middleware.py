"""ASGI middleware: the request body size limit and `--api-key` bearer authentication.

Both answer with the server's JSON error shape before any route runs. The size limit checks the
Content-Length header and also counts the bytes of bodies sent without one (chunked), so no body larger than
`max_body_bytes` is ever buffered.
"""

from __future__ import annotations

import json
import secrets

from starlette.exceptions import HTTPException

from jaxserve.server.errors import error_body

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
OPEN_PATHS = frozenset({"/health"})  # reachable without the API key (liveness probes)


async def _send_error(send, status: int, message: str, headers: list | None = None) -> None:
    body = json.dumps(error_body(status, message)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


class _BodyTooLarge(HTTPException):
    """Raised from `receive` (FastAPI re-raises HTTPExceptions from body reading unchanged)."""

    def __init__(self, message: str) -> None:
        super().__init__(413, message)


class BodySizeLimit:
    """Reject bodies over `max_body_bytes` with 413."""

    def __init__(self, app, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.max_body_bytes
        message = f"request body exceeds the limit of {limit} bytes"
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                return await _send_error(send, 413, message)
        received = 0
        started = False

        async def counting_receive():
            nonlocal received
            event = await receive()
            if event["type"] == "http.request":
                received += len(event.get("body", b""))
                if received > limit:
                    raise _BodyTooLarge(message)
            return event

        async def tracking_send(event):
            nonlocal started
            started = started or event["type"] == "http.response.start"
            await send(event)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except _BodyTooLarge:
            if not started:
                await _send_error(send, 413, message)


class ApiKeyAuth:
    """Require `Authorization: Bearer <api_key>` on every path except `OPEN_PATHS`; 401 otherwise."""

    def __init__(self, app, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        given = dict(scope.get("headers", ())).get(b"authorization", b"")
        if not secrets.compare_digest(given, self.expected):
            message = "missing or wrong API key: send 'Authorization: Bearer <key>'"
            return await _send_error(send, 401, message, [(b"www-authenticate", b"Bearer")])
        return await self.app(scope, receive, send)


class JsonBodies:
    """Treat POST bodies sent as form data (`curl -d` without a Content-Type) as JSON, as every route here
    takes JSON; other content types are left alone."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            headers = [(k, v) for k, v in scope.get("headers", ()) if k != b"content-type"]
            kinds = [v for k, v in scope.get("headers", ()) if k == b"content-type"]
            if not kinds or kinds[0].startswith(b"application/x-www-form-urlencoded"):
                scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        return await self.app(scope, receive, send)
