"""Waiting on a request's events: to the end (`collect`) or one by one (`iterate`), aborting the request
when the HTTP client goes away; and Server-Sent Events framing (`data: {json}\\n\\n`, `data: [DONE]`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request

from jaxserve.server.engine_loop import EngineLoop, Event

DONE = "data: [DONE]\n\n"
DISCONNECT_POLL_S = 0.25


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def _raise_if_error(item: Event | BaseException) -> Event:
    if isinstance(item, BaseException):  # the request's step failed, or the engine loop died (EngineLoop)
        raise RuntimeError(f"the engine failed this request: {item!r}")
    return item


async def collect(loop: EngineLoop, rid: str, events: asyncio.Queue, request: Request | None) -> Event:
    """The final event of `rid`. If `request`'s client disconnects first, the request is aborted (its KV is
    freed) and asyncio.CancelledError is raised."""
    clock = asyncio.get_running_loop()
    next_check = clock.time() + DISCONNECT_POLL_S
    try:
        while True:
            try:  # events may arrive every step: the disconnect check must not wait for a quiet moment
                item = await asyncio.wait_for(events.get(), max(0.0, next_check - clock.time()))
                event = _raise_if_error(item)
                if event.finished:
                    return event
            except TimeoutError:
                pass
            if clock.time() >= next_check:
                if request is not None and await request.is_disconnected():
                    raise asyncio.CancelledError(f"client of {rid} disconnected")
                next_check = clock.time() + DISCONNECT_POLL_S
    except BaseException:
        loop.abort(rid)
        raise


async def collect_all(loop: EngineLoop, handles: list[tuple[str, asyncio.Queue]],
                      request: Request | None) -> list[Event]:
    """Final events of a batch; on disconnect or error every request of the batch is aborted."""
    try:
        return list(await asyncio.gather(*(collect(loop, rid, q, request) for rid, q in handles)))
    except BaseException:
        for rid, _ in handles:
            loop.abort(rid)
        raise


async def iterate(loop: EngineLoop, rid: str, events: asyncio.Queue) -> AsyncIterator[Event]:
    """Events of `rid` until its final one. If the consumer stops early (the streaming response was closed
    because the client disconnected), the request is aborted."""
    finished = False
    try:
        while not finished:
            event = _raise_if_error(await events.get())
            finished = event.finished
            yield event
    finally:
        if not finished:
            loop.abort(rid)
