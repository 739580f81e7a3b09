"""/v1/chat/completions: OpenAI's chat completions over the generation pipeline."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ... import pipeline
from ...request.protocol import parse_chat
from ...request.reasoning import request_budget
from ...state import open_request
from ..bodies import Envelope
from .render import ChatStream, chat_body


async def chat_completions(request: Request) -> Response:
    host, key, body = await open_request(request)
    params = parse_chat(body, host.engine.info.n_vocab, host.config.sampling)
    budget = request_budget(body, host.config.reasoning_budget)
    generation = await pipeline.start_chat(request, host, key, params, budget=budget, endpoint="chat")
    env = Envelope.of(generation, "chatcmpl")
    vocab = host.engine.vocab
    if params.gen.stream:
        return pipeline.sse_response(generation, ChatStream(env, vocab, params.gen, generation.n_choices))
    reply = await generation.collect(request)
    out = chat_body(env, reply, vocab, params.gen.logprobs is not None)
    if params.gen.explain_cache:
        out["warmslot"] = {"cache": generation.explanation()}
    if body.get("verbose") is True or (host.config.log_level == "debug" and body.get("verbose") is not False):
        out["__verbose"] = {"prompt": generation.prompt.text if generation.prompt else ""}  # llama-server's debug field
    return JSONResponse(out, headers=generation.headers)


async def input_tokens(request: Request) -> Response:
    """/chat/completions/input_tokens (llama-server's): the prompt tokens the same chat body
    would take, rendered and tokenized as /v1/chat/completions does, tools included."""
    host, _key, body = await open_request(request)
    params = parse_chat(body, host.engine.info.n_vocab, host.config.sampling)
    plan = await host.server.offload(pipeline.plan_chat, host, params, -1, request=request)
    return JSONResponse({"input_tokens": len(plan.prompt.tokens)})
