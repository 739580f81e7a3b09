"""llama-server's /lora-adapters: GET lists the LoRA adapters loaded with --lora and
--lora-scaled and the scale each runs at for requests that name none; POST sets those scales
(`[{"id": 0, "scale": 0.5}]`; an adapter left out goes to 0, as in llama-server).

A request's own `lora` field overrides the default for that request only
(request/lora.py). POST changes what every tenant's requests run under, so it needs the
admin key, as the model and slot actions do.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..errors import Forbidden, InvalidRequest
from ..request.json_body import parse_json
from ..request.lora import parse_lora
from ..state import ModelHost, named_model

__all__ = ["adapters_view", "get_adapters", "set_adapters"]


def adapters_view(host: ModelHost) -> list[dict]:
    """The adapters as llama-server lists them, with their default scales."""
    out: list[dict] = []
    if not host.lora_scales:  # none loaded (--lora)
        return out
    for info, scale in zip(host.engine.info.adapters, host.lora_scales):
        entry = {"id": info.id, "path": info.path, "scale": scale, "task_name": info.task_name,
                 "prompt_prefix": info.prompt_prefix}
        if info.invocation_tokens:
            entry["alora_invocation_string"] = host.engine.vocab.detokenize(list(info.invocation_tokens))
            entry["alora_invocation_tokens"] = list(info.invocation_tokens)
        out.append(entry)
    return out


async def get_adapters(request: Request) -> Response:
    host = named_model(request, request.query_params.get("model"))
    host.server.authorize(request)
    host.require_ready()
    return JSONResponse(adapters_view(host))


async def set_adapters(request: Request) -> Response:
    host = named_model(request, request.query_params.get("model"))
    server = host.server
    if not server.is_admin(server.authorize(request)):
        raise Forbidden("setting the LoRA adapters' default scales needs the admin key (--admin-key, else the first --api-key)")
    host.require_ready()
    body = parse_json(await request.body(), "an array of objects with 'id' and 'scale'")
    if not isinstance(body, list):
        raise InvalidRequest("the request body must be an array of objects with 'id' and 'scale'")
    scales = parse_lora(body, len(host.engine.info.adapters), param="body")
    host.lora_scales = tuple(scales.get(i, 0.0) for i in range(len(host.engine.info.adapters)))
    return JSONResponse({"success": True})
