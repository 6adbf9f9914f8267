"""Grammar compilation off the engine thread: a request's json_schema / regex / ebnf is compiled on a worker
thread before the request is submitted, so that the engine thread finds it in the backend's cache (a request
waits for its grammar; the batch does not). Errors are left to the engine's own check (a 400 naming the
grammar), so a bad grammar is reported the same way whatever the route."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from jaxserve.sampling.errors import InvalidSamplingParamsError
from jaxserve.sampling.params import GRAMMAR_KINDS
from jaxserve.server.engine_loop import EngineLoop


async def precompile(loop: EngineLoop, params: Iterable[dict[str, Any]]) -> None:
    """Compile every grammar named in `params` (sampling-param dicts) into the engine's grammar cache."""
    backend = loop.engine.grammar
    if backend is None:
        return
    grammars = {(k, p[k]) for p in params for k in GRAMMAR_KINDS if isinstance(p.get(k), str)}
    for kind, source in grammars:
        try:
            await asyncio.get_running_loop().run_in_executor(None, backend.compile, kind, source)
        except InvalidSamplingParamsError:
            return  # the engine raises it again on submit, with the request's index
