"""`POST /save_cache`: write the prefix cache and its KV to the `--cache-snapshot` directory now (between
engine steps), as a graceful shutdown does. Answers `{"success", "num_nodes", "num_slots", "path"}`; 400 when
the server runs without `--cache-snapshot`. See `jaxserve.server.cache_snapshot`."""

from __future__ import annotations

from fastapi import APIRouter, Request

from jaxserve.server import cache_snapshot
from jaxserve.server.errors import APIError

router = APIRouter()


@router.post("/save_cache")
async def save_cache(request: Request) -> dict:
    directory = request.app.state.cache_snapshot
    if directory is None:
        raise APIError(400, "this server has no snapshot directory: start it with --cache-snapshot DIR")
    saved = await request.app.state.server.loop.call(lambda engine: cache_snapshot.save(engine, directory))
    return {"success": True, "num_nodes": saved.num_nodes, "num_slots": saved.num_slots,
            "path": str(directory)}
