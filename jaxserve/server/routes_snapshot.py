"""`POST /save_cache`: write the prefix cache and its KV to the `--cache-snapshot` directory now (between
engine steps), as a graceful shutdown does. Answers `{"success", "num_nodes", "num_slots", "path"}`; 400 when
the server runs without `--cache-snapshot`, 409 while a live request locks the prefix tree (nothing written).
See `jaxserve.server.cache_snapshot`."""

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
    loop = request.app.state.server.loop
    try:
        saved = await loop.call(lambda engine: cache_snapshot.save(engine, directory))
    except cache_snapshot.SnapshotRefused as e:
        raise APIError(409, f"snapshot not saved: {e}") from None
    return {"success": True, "num_nodes": saved.num_nodes, "num_slots": saved.num_slots,
            "path": str(directory)}
