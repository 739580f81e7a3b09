"""Service routes: health, tokenize and detokenize, the slots and engine views and the recent
requests (the models: `props.py`)."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..errors import Forbidden, InvalidRequest, NotSupported, Unavailable, shutting_down
from ..request.constraints import validate_tools
from ..request.chat_messages import parse_messages
from ..request.json_body import parse_body
from ..request.protocol import parse_chat
from ..state import named_model, open_model, server_of


async def health(request: Request) -> Response:
    server = server_of(request)
    host = server.default
    if host.init_error is not None:
        return JSONResponse({"status": "error", "error": {"message": str(host.init_error), "type": "server_error"}}, 500)
    if server.draining:
        return JSONResponse({"status": "shutting_down", "error": shutting_down().body()["error"]}, 503, headers={"Retry-After": "1"})
    if not host.ready and server.models is None:  # several models: each loads when a request names it
        return JSONResponse(
            {"status": "loading", "progress": round(host.engine.load_progress, 3), "error": {"message": "the model is loading", "type": "unavailable_error", "code": "loading"}},
            503,
            headers={"Retry-After": "5"},
        )
    return JSONResponse({"status": "ok"})

async def tokenize(request: Request) -> Response:
    """Tokens the server would evaluate: for `content` (a text prompt, as /v1/completions
    tokenizes it) or for `messages` (and `tools`), as /v1/chat/completions renders them."""
    host, _key, body = await open_model(request)
    if "messages" in body:
        messages = parse_messages(body["messages"])
        tools = body.get("tools")
        prompt = await host.server.offload(lambda: host.builder.build(messages, validate_tools(tools) if tools else None))
        spans = [{"role": role, "start": glue, "content_start": content} for role, glue, content in prompt.messages]
        return JSONResponse({"tokens": prompt.tokens, "messages": spans})
    content = body.get("content")
    if not isinstance(content, str):
        raise InvalidRequest("send 'content' (a string) or 'messages'", param="content")
    add_special = body.get("add_special", False)  # llama-server's default: no BOS
    with_pieces = body.get("with_pieces", False)
    for name, value in (("add_special", add_special), ("with_pieces", with_pieces)):
        if not isinstance(value, bool):
            raise InvalidRequest(f"'{name}' must be a boolean", param=name)
    vocab = host.engine.vocab

    def run() -> list:
        tokens = vocab.tokenize(content, add_special=add_special, parse_special=True)
        return [{"id": t, "piece": _piece(vocab.token_piece(t))} for t in tokens] if with_pieces else tokens

    return JSONResponse({"tokens": await host.server.offload(run)})


def _piece(raw: bytes) -> str | list[int]:
    """A token's text, or its bytes where they are not whole UTF-8 (part of a character)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


async def apply_template(request: Request) -> Response:
    """llama-server's POST /apply-template: the prompt text the chat template renders for
    `messages` (and `tools`), as /v1/chat/completions would, without generating."""
    host, _key, body = await open_model(request)
    params = parse_chat(body, host.engine.info.n_vocab, host.config.sampling)
    tools = validate_tools(params.tools) if params.tools else None
    add_generation_prompt = body.get("add_generation_prompt", True)
    if not isinstance(add_generation_prompt, bool):
        raise InvalidRequest("'add_generation_prompt' must be a boolean", param="add_generation_prompt")
    text = await host.server.offload(lambda: host.builder.render_text(
        params.messages, tools, add_generation_prompt=add_generation_prompt, extra=params.template_kwargs, continue_final=params.continue_final,
    ))
    return JSONResponse({"prompt": text})  # rendered only: a prompt longer than a slot is still shown


async def detokenize(request: Request) -> Response:
    host, _key, body = await open_model(request)
    tokens = body.get("tokens")
    n_vocab = host.engine.info.n_vocab
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < n_vocab for t in tokens):
        raise InvalidRequest(f"'tokens' must be a list of token ids (0..{n_vocab - 1})", param="tokens")
    text = await host.server.offload(host.engine.vocab.detokenize, tokens)
    return JSONResponse({"content": text})

async def _engine_snapshot(request: Request):
    """The detailed snapshot a key may see: details of its own tenants only, unless it is the
    admin key (other tenants' slots show their id and state)."""
    host = named_model(request, request.query_params.get("model"))
    key = host.server.authorize(request)
    if not host.config.slots_endpoint:
        raise NotSupported("the /slots and /engine endpoints are disabled (--no-slots)")
    host.require_ready()
    visible = host.server.visible_tenants(key)
    return host, await asyncio.get_running_loop().run_in_executor(None, lambda: host.engine.snapshot(detail=True, visible=visible))


async def slots_view(request: Request) -> Response:
    """llama-server's GET /slots: an array of --parallel objects, as llama-server's clients
    count them, in its field names (`id`, `n_ctx`, `is_processing`, ...), with warmslot's own
    fields beside them. With spare sequences (idle conversations kept in memory, any of which
    a request may run on) they are the sequences running requests, then idle ones, lowest id
    first, in id order (more than --parallel while quick requests run beside them, so that
    every running request is listed); GET /engine lists every sequence. `?fail_on_no_slot=1`
    answers 503 when --parallel of them are running (a quick request may still start)."""
    host, snapshot = await _engine_snapshot(request)
    info = host.engine.info
    speculative = host.config.engine.spec.type != "none"
    views = snapshot.to_json()["slots"]
    n_shown = max(info.n_slots, sum(v["state"] != "idle" for v in views))
    shown = sorted(sorted(views, key=lambda v: (v["state"] == "idle", v["id"]))[:n_shown], key=lambda v: v["id"])
    slots = [_slot_body(view, info.n_ctx_slot, speculative) for view in shown]
    if request.query_params.get("fail_on_no_slot") and sum(s["is_processing"] for s in slots) >= info.n_slots:
        raise Unavailable("no slot available", retry_after=1, code="no_slot")
    return JSONResponse(slots)


def _slot_body(view: dict, n_ctx: int, speculative: bool) -> dict:
    body = {"id": view["id"], "n_ctx": n_ctx, "speculative": speculative, "is_processing": view["state"] != "idle"}
    request = view.get("request")
    if request is not None:
        body.update(
            id_task=request["id"], n_prompt_tokens=request["n_prompt"],
            n_prompt_tokens_processed=request["n_prompt"] - request["n_cached"], n_prompt_tokens_cache=request["n_cached"],
        )
    return {**body, **view}


async def engine_view(request: Request) -> Response:
    """The whole engine at one instant: the slots, the queue, the prompt cache and what is
    held where (capacity)."""
    host, snapshot = await _engine_snapshot(request)
    capacity = host.engine.info.capacity
    return JSONResponse({**snapshot.to_json(), "capacity": capacity.to_json() if capacity is not None else None})


async def recent_requests(request: Request) -> Response:
    """GET /engine/requests: the last requests that ended, every tenant's, newest first, for
    the admin key only (403 for another key); `?limit=N` gives the newest N. Redacted as /slots
    redacts (see recent_requests.py): what a slot's view shows the admin, and the miss
    explanation's positions, never a prompt's text or an image."""
    server = server_of(request)
    if not server.is_admin(server.authorize(request)):
        raise Forbidden("/engine/requests shows every tenant's requests: it needs the admin key (--admin-key, else the first --api-key)")
    if not server.config.slots_endpoint:
        raise NotSupported("the /slots and /engine endpoints are disabled (--no-slots)")
    limit = request.query_params.get("limit")
    if limit is not None and not (limit.isdigit() and int(limit) > 0):
        raise InvalidRequest("'limit' must be a positive integer", param="limit")
    items = server.recent.newest_first(int(limit) if limit is not None else None)
    return JSONResponse({"object": "list", "data": [s.to_json() for s in items]})
