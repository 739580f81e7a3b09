"""POST /models/load and /models/unload (llama-server's router routes): load a model ahead of
its first request, or unload one now (its conversations kept in its prompt cache). Both take
`{"model": NAME}` and need the admin key, as slot actions do. GET /models/capacity: what each
model takes and whether they fit together (`models/capacity.py`), for any key, as /props
shows a model's capacity table. A server of one model has none of them (404)."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import Forbidden, InvalidRequest, Unavailable
from ..models.capacity import capacity_view
from ..models.registry import ModelState
from ..request.json_body import parse_body
from ..state import server_of


async def _entry(request: Request):
    server = server_of(request)
    if not server.is_admin(server.authorize(request)):
        raise Forbidden("loading and unloading models needs the admin key (--admin-key, else the first --api-key)")
    assert server.models is not None, "the routes are added with several models only"
    wanted = parse_body(await request.body()).get("model")
    if not isinstance(wanted, str) or not wanted:
        raise InvalidRequest("send 'model', a model's name", param="model")
    return server.models, server.models.resolve(wanted)


async def load(request: Request) -> Response:
    models, entry = await _entry(request)
    await models.load(entry)
    return JSONResponse({"success": True, "model": entry.name, "state": entry.state.value})


async def unload(request: Request) -> Response:
    models, entry = await _entry(request)
    if not await models.unload(entry) and entry.state is ModelState.LOADED:
        raise Unavailable(f"the model '{entry.name}' is serving requests; try again when they end", retry_after=1, code="model_busy")
    return JSONResponse({"success": True, "model": entry.name, "state": entry.state.value})


async def capacity(request: Request) -> Response:
    server = server_of(request)
    server.authorize(request)
    assert server.models is not None, "the routes are added with several models only"
    view = await asyncio.get_running_loop().run_in_executor(None, capacity_view, server.models)
    return JSONResponse(view)


ROUTES = [
    Route("/models/load", load, methods=["POST"]),
    Route("/models/unload", unload, methods=["POST"]),
    Route("/models/capacity", capacity),
]
