"""What a load balancer in front of several replicas asks each one.

vllm-router and sglang-router (and others built on them) call these paths on their workers;
warmslot answers with the names and shapes they read:

- `GET /get_load`: `{"load": requests running + waiting, ...}`; power_of_two balancing reads
  `load`. Open, like /health: the router polls it without a key, and it holds only counts.
  With API keys, KV cells and cache bytes are shown to the admin key only.
- `GET /get_model_info`: the served model (the router's own /get_model_info proxies it).
- `GET /get_server_info`: the replica's settings, KV layout, placement on devices and the
  bytes each device holds. Needs the API key when one is set.
- `GET /health_generate`: 200 once the engine thread answers between two steps. /health says
  the model is loaded; this says the engine is still stepping. It evaluates no token, so a
  router polling it never takes a slot from a conversation.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import Unauthorized, Unavailable
from ..state import ModelHost, server_of
from ..version import version_info

ENGINE_ANSWER_TIMEOUT = 10.0  # seconds: longer than any one step (a bounded batch) should take


def _ready(request: Request) -> ModelHost:
    host = server_of(request).default
    host.require_ready()
    return host


async def get_load(request: Request) -> Response:
    host = _ready(request)
    snap = host.engine.snapshot()
    states = snap.states() if snap is not None else {}
    running = states.get("prefill", 0) + states.get("decode", 0)
    waiting = host.engine.queue_depth
    body = {
        "load": running + waiting,
        "running": running,
        "waiting": waiting,
        "slots": host.engine.info.n_slots,
    }
    if _sees_detail(host, request):
        body["kv_cells_used"] = sum(s.n_tokens for s in snap.slots) if snap is not None else 0
        body["kv_cells_total"] = host.engine.info.n_ctx
        body["prompt_cache_bytes"] = snap.cache.bytes if snap is not None and snap.cache is not None else 0
    return JSONResponse(body)


def _sees_detail(host: ModelHost, request: Request) -> bool:
    """KV cells and cache bytes follow other tenants' prompts as they grow: with API keys,
    only the admin key sees them (a router without a key gets the coarse load)."""
    if not host.config.api_keys:
        return True
    try:
        return host.server.is_admin(host.server.authorize(request))
    except Unauthorized:
        return False


async def get_model_info(request: Request) -> Response:
    host = _ready(request)
    info = host.engine.info
    return JSONResponse({
        "model_id": host.model_name,
        "is_generation": True,
        "arch": info.arch,
        "n_params": info.n_params,
        "n_vocab": info.n_vocab,
        "n_ctx_train": info.n_ctx_train,
        "n_ctx": info.n_ctx_slots,
        "n_ctx_slot": info.n_ctx_slot,
        "memory": info.memory.value,
    })


async def get_server_info(request: Request) -> Response:
    host = server_of(request).default
    host.server.authorize(request)
    host.require_ready()
    info, engine_config = host.engine.info, host.config.engine
    placement = engine_config.placement
    return JSONResponse({
        "version": version_info()["version"],
        "model_id": host.model_name,
        "model_path": info.model_path,
        "fingerprint": info.fingerprint,
        "slots": info.n_slots,
        "sequences": info.n_seq,
        "n_ctx": info.n_ctx,
        "n_ctx_slot": info.n_ctx_slot,
        "kv_unified": info.kv_unified,
        "memory": info.memory.value,
        "kv_bytes_per_token": info.kv_bytes_per_token,
        "cache_ram_bytes": engine_config.cache_ram,
        "n_gpu_layers": engine_config.n_gpu_layers,
        "placement": {
            "split_mode": placement.split_mode,
            "main_gpu": placement.main_gpu,
            "tensor_split": list(placement.tensor_split),
            "devices": None if placement.devices is None else list(placement.devices),
            "rpc_servers": list(placement.rpc_servers),
        },
        "device_memory": [asdict(d) for d in info.device_memory],
    })


async def health_generate(request: Request) -> Response:
    host = _ready(request)
    answered = asyncio.wrap_future(host.engine.call(lambda engine: True))
    try:
        await asyncio.wait_for(answered, ENGINE_ANSWER_TIMEOUT)
    except asyncio.TimeoutError:
        raise Unavailable(f"the engine did not answer within {ENGINE_ANSWER_TIMEOUT:.0f} s", retry_after=5) from None
    return JSONResponse({"status": "ok"})


ROUTES = [
    Route("/get_load", get_load),
    Route("/get_model_info", get_model_info),
    Route("/get_server_info", get_server_info),
    Route("/health_generate", health_generate),
]

# endpoint labels of warmslot_requests_total
ENDPOINTS = {
    "/get_load": "load",
    "/get_model_info": "model_info",
    "/get_server_info": "server_info",
    "/health_generate": "health_generate",
}
