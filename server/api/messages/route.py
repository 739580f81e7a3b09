"""/v1/messages and /v1/messages/count_tokens: Anthropic's Messages API over the pipeline.

A request is converted to the chat request it stands for (`convert`) and goes through the
chat pipeline exactly as /v1/chat/completions would, so a conversation keeps its cached
prefix whichever API it comes through. The model answers under the name the client sent
(Claude Code sends its own model names): with one model any name is accepted; with several
(`--models-file`), the name picks one, wildcards such as `claude-*haiku*` included. Both `x-api-key` and
`Authorization: Bearer` carry the key (`Server.authorize`); `anthropic-version` and
`anthropic-beta` are accepted and change nothing: a beta is never a reason to refuse a
request. What a request sends that changes nothing (its betas, `context_management`, server
tools) is named in a debug log line.
"""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ... import pipeline
from ...state import open_request
from .convert import parse_request
from .render import MessageStream, message_body

log = logging.getLogger("warmslot.server")


async def create_message(request: Request) -> Response:
    host, key, body = await open_request(request)
    parsed = _parse(host, body, request)
    generation = await pipeline.start_chat(
        request, host, key, parsed.chat, budget=parsed.budget, endpoint="messages", prompt_param="messages"
    )
    message_id = f"msg_{generation.id}"
    if parsed.chat.gen.stream:
        cached = generation.reuse.cached if generation.reuse is not None else 0
        renderer = MessageStream(message_id, parsed.model, len(generation.prompts[0]), cached)
        return pipeline.sse_response(generation, renderer)
    reply = await generation.collect(request)
    return JSONResponse(message_body(message_id, parsed.model, reply), headers=generation.headers)


async def count_tokens(request: Request) -> Response:
    """The prompt tokens the same body would take, rendered and tokenized exactly as
    /v1/messages renders it (tools and the system prompt included)."""
    host, key, body = await open_request(request)
    parsed = _parse(host, body, request, count_only=True)
    plan = await host.server.offload(pipeline.plan_chat, host, parsed.chat, -1, request=request)
    return JSONResponse({"input_tokens": len(plan.prompt.tokens)})


def _parse(host, body: dict, request: Request, count_only: bool = False):
    config = host.config
    parsed = parse_request(
        body, host.engine.info.n_vocab, config.sampling, default_budget=config.reasoning_budget,
        keep_billing_header=config.keep_billing_header, count_only=count_only,
    )
    betas = request.headers.get("anthropic-beta")
    if (parsed.ignored or betas) and log.isEnabledFor(logging.DEBUG):
        log.debug("messages: ignored %s; anthropic-beta: %s", ", ".join(parsed.ignored) or "nothing", betas or "none")
    return parsed
