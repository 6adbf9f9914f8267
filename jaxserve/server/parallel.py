"""Parallel sampling (`n` choices per prompt): prefill once, then fork.

Each prompt is submitted once (choice 0). When its first event arrives - its prefill has run and, with the
radix cache on, its prompt is in the prefix tree - the other `n - 1` choices are submitted with the same
prompt: they match the cached prefix and recompute only its partial last page, so the prompt's KV is held
once (the tree's pages, locked by every choice) and each choice allocates only its own output. Choice i of a
request with `seed` s samples with seed s + i; without a seed each choice draws its own from the engine.
With the radix cache disabled the forks prefill again (still correct, no sharing).

`best_of` (completions): `best_of` choices are sampled the same way and `best` keeps the n whose output
tokens have the highest mean logprob (the logprob of each token under the distribution it was drawn from).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import Request

from jaxserve.server import streaming
from jaxserve.server.engine_loop import EngineLoop, Event

Handle = tuple[str, Any]  # (request id, its event queue: `get()` coroutine)


class _Replay:
    """An event queue whose first event was already taken off: `get` returns it, then the queue's."""

    def __init__(self, first: Any, rest: asyncio.Queue) -> None:
        self._first, self._rest = [first], rest

    async def get(self) -> Any:
        return self._first.pop() if self._first else await self._rest.get()


def choice_params(params: dict[str, Any], index: int) -> dict[str, Any]:
    """Sampling params of choice `index`: the request's, with seed + index when a seed is given."""
    return {**params, "seed": params["seed"] + index} if "seed" in params and index else params


def mean_logprob(meta: dict) -> float:
    """Mean logprob per output token of a finished choice (`output_token_logprobs`); 0.0 without tokens."""
    logprobs = [lp for lp, _ in meta["output_token_logprobs"]]
    return sum(logprobs) / len(logprobs) if logprobs else 0.0


def best(metas: Sequence[dict], n: int) -> list[int]:
    """Indices of the `n` choices (of one prompt) with the highest `mean_logprob`, best first; a tie keeps
    the earlier choice first."""
    scores = [mean_logprob(m) for m in metas]
    return sorted(range(len(metas)), key=lambda i: (-scores[i], i))[:n]


async def _first_event(loop: EngineLoop, rid: str, events: asyncio.Queue, request: Request | None) -> Any:
    while True:
        try:
            return await asyncio.wait_for(events.get(), streaming.DISCONNECT_POLL_S)
        except TimeoutError:
            if request is not None and await request.is_disconnected():
                raise asyncio.CancelledError(f"client of {rid} disconnected") from None


async def submit(loop: EngineLoop, prompts: Sequence[str] | None, input_ids: Sequence[Sequence[int]] | None,
                 params: dict[str, Any], n: int, request: Request | None) -> list[list[Handle]]:
    """Submit `n` choices of every prompt (text `prompts` or token `input_ids`); returns per prompt its n
    handles, choice order. All prompts are validated before any runs (an invalid one raises, nothing stays
    queued). Waits for the prompts' prefills when n > 1; on disconnect or error every choice is aborted."""
    parents = await loop.submit(prompts, input_ids, [params] * len(prompts if prompts is not None
                                                                     else input_ids))
    if n == 1:
        return [[handle] for handle in parents]
    submitted = [rid for rid, _ in parents]
    try:
        firsts = await asyncio.gather(*(_first_event(loop, rid, q, request) for rid, q in parents))
        out = []
        for i, ((rid, q), first) in enumerate(zip(parents, firsts, strict=True)):
            forks = await loop.submit(None if prompts is None else [prompts[i]] * (n - 1),
                                      None if input_ids is None else [input_ids[i]] * (n - 1),
                                      [choice_params(params, k) for k in range(1, n)])
            submitted += [r for r, _ in forks]
            out.append([(rid, _Replay(first, q)), *forks])
        return out
    except BaseException:
        for rid in submitted:
            loop.abort(rid)
        raise


async def merge(loop: EngineLoop, handles: Sequence[Handle]) -> AsyncIterator[tuple[int, Event]]:
    """(choice index, event) of several requests as they come, until every one has finished; stopping
    early (client gone) aborts the requests still running."""
    merged: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, rid: str, events) -> None:
        finished = False
        try:
            while not finished:
                item = await events.get()
                finished = isinstance(item, BaseException) or item.finished
                await merged.put((index, item))
        finally:
            if not finished:  # cancelled: the consumer went away
                loop.abort(rid)

    tasks = [asyncio.ensure_future(pump(i, rid, q)) for i, (rid, q) in enumerate(handles)]
    live = len(tasks)
    try:
        while live:
            index, item = await merged.get()
            if isinstance(item, BaseException):  # the engine loop died
                raise RuntimeError(f"the engine loop failed: {item!r}")
            live -= item.finished
            yield index, item
    finally:
        for task in tasks:
            task.cancel()
