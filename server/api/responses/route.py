"""/v1/responses: OpenAI's Responses API on the chat machinery.

A request is converted to the chat request it stands for (`responses_api`), rendered,
constrained and parsed exactly as /v1/chat/completions would, and its answer becomes output
items. With `previous_response_id` the stored conversation comes first, so the prompt is the
previous one plus what is new and the prefix cache serves the shared part. Responses are
stored (unless `store: false`) per tenant for follow-ups and GET /v1/responses/{id}.
"""

from __future__ import annotations

import functools
import time

from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from warmslot.slots import FinishReason

from .. import explain
from ..errors import ApiError
from ..logprobs import chat_content
from ..output.events import ReasoningDelta
from ..protocol import ChatParams, parse_messages
from ..response_store import StoredResponse
from ..responses_api import ResponsesParams, chat_messages, items_message, output_items, parse_responses, response_body, usage_body
from ..responses_stream import ResponseEvents
from ..state import Warmslot, open_request, server_of
from .generation import _checkpoint_boundaries, _collect, _count_tokens, _log_request, _plan_chat, _started, check_n, output_parser
from ..output.reply import parse_event, parse_reply


async def create_response(request: Request) -> Response:
    server, key, body = await open_request(request)
    params = parse_responses(body, server.engine.info.n_vocab, server.config.sampling)
    check_n(server, params.gen.n)
    tenant = server.tenant(key, params.gen.tenant_hint)
    history = server.responses.get(tenant, params.previous_response_id).messages if params.previous_response_id else []
    conversation = history + params.messages
    chat = ChatParams(
        messages=parse_messages(chat_messages(params.instructions, [], conversation)),
        gen=params.gen,
        tools=params.tools,
        tool_choice=params.tool_choice,
        parallel_tool_calls=params.parallel_tool_calls,
        response_format=params.response_format,
    )
    budget = server.config.reasoning_budget  # --reasoning-budget (the API's reasoning.effort is not mapped)
    plan = await server.offload(_plan_chat, server, chat, budget)
    prompt = plan.prompt
    sub = server.submit(prompt.tokens, params.gen, key, plan.grammar, _checkpoint_boundaries(prompt))
    started = await _started(sub, request)
    resp_id = f"resp_{sub.req.id}"
    skeleton = functools.partial(response_body, resp_id, int(time.time()), server.model_name, params)
    parser = output_parser(server, plan)
    headers = explain.header(started.reuse, len(prompt.tokens), prompt)
    done = functools.partial(_log_request, "responses", started.reuse, prompt)

    def keep(body: dict, items: list[dict]) -> None:
        if params.store:
            server.responses.put(tenant, resp_id, StoredResponse(body, conversation + [items_message(items)]))

    if params.gen.stream:
        sub.stop_watching()
        events = ResponseEvents(skeleton, params.gen.logprobs is not None)
        return EventSourceResponse(_stream(server, sub, parser, events, params, done, keep), headers=headers, ping=15)
    logprobs = [] if params.gen.logprobs is not None else None
    text, usage, finish = await _collect(sub, request, logprobs)
    done(usage)
    parsed = parse_reply(parser, text, finish)
    lp = chat_content(server.engine.vocab, logprobs) if logprobs is not None else None
    items = output_items(parsed, lp)
    n_reasoning = await _count_tokens(server, parsed.reasoning_content)
    incomplete = "max_output_tokens" if finish is FinishReason.LENGTH else None
    body = skeleton(
        status="incomplete" if incomplete else "completed", output=items, usage=usage_body(usage, n_reasoning), incomplete=incomplete
    )
    keep(body, items)
    return JSONResponse(body, headers=headers)


async def _stream(server: Warmslot, sub, parser, events: ResponseEvents, params: ResponsesParams, done, keep):
    vocab = server.engine.vocab
    for ev in events.start():
        yield ev
    try:
        pending: list = []  # logprobs of tokens whose text the parser still holds back
        reasoning: list[str] = []
        async for ev in sub.events():
            deltas = parse_event(parser, ev)
            pending += ev.logprobs
            for delta in deltas:
                if isinstance(delta, ReasoningDelta):
                    reasoning.append(delta.text)
                lp = chat_content(vocab, pending) if params.gen.logprobs is not None else []
                pending = []
                for out in events.feed(delta, lp):
                    yield out
            if ev.finish is not None:
                done(ev.usage)
                usage = usage_body(ev.usage, await _count_tokens(server, "".join(reasoning)))
                incomplete = "max_output_tokens" if ev.finish is FinishReason.LENGTH else None
                finished = events.finish(usage, incomplete)
                keep(events.response, events.output())
                for out in finished:
                    yield out
    except ApiError as exc:
        for out in events.fail(exc.body()["error"]):
            yield out


async def get_response(request: Request) -> Response:
    server = server_of(request)
    key = server.authorize(request)
    hint = request.query_params.get("cache_salt") or request.query_params.get("user") or ""
    stored = server.responses.get(server.tenant(key, hint), request.path_params["response_id"], param="response_id")
    return JSONResponse(stored.body)


async def delete_response(request: Request) -> Response:
    server = server_of(request)
    key = server.authorize(request)
    hint = request.query_params.get("cache_salt") or request.query_params.get("user") or ""
    resp_id = request.path_params["response_id"]
    server.responses.delete(server.tenant(key, hint), resp_id)
    return JSONResponse({"id": resp_id, "object": "response", "deleted": True})

