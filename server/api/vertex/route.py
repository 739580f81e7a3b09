"""Vertex AI's prediction protocol, for a custom container on Google Cloud.

With `AIP_MODE=PREDICTION` in the environment the server listens on `AIP_HTTP_PORT` (8080),
answers health checks at `AIP_HEALTH_ROUTE` as at /health, and takes
`POST AIP_PREDICT_ROUTE` (/predict): `{"instances": [...]}`, each instance a request body with
`@requestFormat` naming the route, by its camelCase name ("chatCompletions" for
/v1/chat/completions, "embeddings", "rerank") or by its path. Each instance runs through the
app as its own request (authentication, limits and metrics included, never streamed), at
once with the others, and `{"predictions": [...]}` holds each answer's body, an error body
for one that failed. The process reads these settings (server/process/vertex_settings.py).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ...errors import InvalidRequest
from ...process.vertex_settings import Vertex, from_env  # noqa: F401  (from_env: read by the process, named here too)

MAX_INSTANCES = 128
FORWARDED = (b"authorization", b"x-api-key", b"cookie")


def request_format(path: str) -> str:
    """A route's camelCase name: /v1/chat/completions -> chatCompletions, /apply-template -> applyTemplate."""
    path = path.removeprefix("/v1").lstrip("/").split("{")[0]
    words = [w for w in path.replace("-", "/").replace("_", "/").split("/") if w]
    return "".join(w if i == 0 else w[:1].upper() + w[1:] for i, w in enumerate(words))


def routes(vertex: Vertex, posts: list[Route], health) -> list[Route]:
    """The predict route over the app's POST routes, and the health alias."""
    paths: dict[str, str] = {}
    for r in posts:
        if "{" not in r.path:
            paths.setdefault(request_format(r.path), r.path)
            paths.setdefault(r.path, r.path)

    async def predict(request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError as exc:
            raise InvalidRequest(f"the body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise InvalidRequest("the body must be a JSON object")
        instances = body.get("instances")
        if not isinstance(instances, list):
            raise InvalidRequest("the body must have an array 'instances'", param="instances")
        if len(instances) > MAX_INSTANCES:
            raise InvalidRequest(f"'instances' holds at most {MAX_INSTANCES}", param="instances")
        headers = [(k, v) for k, v in request.scope["headers"] if k in FORWARDED]
        answers = await asyncio.gather(*(_one(request, paths, headers, i, x) for i, x in enumerate(instances)))
        return JSONResponse({"predictions": answers})

    out = [Route(vertex.predict_route, predict, methods=["POST"])]
    if vertex.health_route:
        out.append(Route(vertex.health_route, health, methods=["GET"]))
    return out


def _error(message: str, param: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}}


async def _one(request: Request, paths: dict[str, str], headers: list, index: int, instance: Any) -> Any:
    param = f"instances[{index}]"
    if not isinstance(instance, dict) or not isinstance(instance.get("@requestFormat"), str):
        return _error("each instance must be an object with a string @requestFormat", param)
    payload = {k: v for k, v in instance.items() if k != "@requestFormat"}
    if "stream" in payload:
        payload["stream"] = False  # one body per prediction
    path = paths.get(instance["@requestFormat"])
    if path is None:
        return _error(f"no route for @requestFormat {instance['@requestFormat']!r}", f"{param}.@requestFormat")
    status, body = await _call(request, path, headers, json.dumps(payload).encode())
    try:
        return json.loads(body) if body else None
    except ValueError:
        return body.decode("utf-8", errors="replace")


async def _call(request: Request, path: str, headers: list, body: bytes) -> tuple[int, bytes]:
    """One POST through the whole app, in this process."""
    scope = {
        **{k: request.scope[k] for k in ("type", "http_version", "scheme", "server", "client", "root_path") if k in request.scope},
        "method": "POST", "path": path, "raw_path": path.encode(), "query_string": b"",
        "headers": [*headers, (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "app": request.scope.get("app"), "state": dict(request.scope.get("state") or {}),
    }
    sent = False
    status, chunks = 500, []

    async def receive() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        while not await request.is_disconnected():  # the caller of /predict left: so did this one
            await asyncio.sleep(0.5)
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await request.app(scope, receive, send)
    return status, b"".join(chunks)
