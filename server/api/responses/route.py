"""/v1/responses handlers: create (plain or streamed), retrieve and delete.

A request is converted to the chat request it stands for (`items`), and goes through the
chat pipeline exactly as /v1/chat/completions would; its answer becomes output items. With
`previous_response_id` the stored conversation comes first, so the prompt is the previous
one plus what is new and the prefix cache serves the shared part. Responses are stored
(unless `store: false`) per tenant for follow-ups and GET /v1/responses/{id}. A stateless
client gets the same reuse from the signed turns of its reasoning items (signed_turns.py).
"""

from __future__ import annotations

import functools

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ... import pipeline
from ...prompt.exact_turns import ExactTurn, prompt_digest
from ...request.limits import check_conversation
from ...output.logprob_shapes import chat_content
from ...request.chat_messages import parse_messages
from ...request.protocol import ChatParams
from ...state import open_request, server_of
from .items import EXACT_KEY, chat_messages, items_message, output_items, parse_responses, response_body, usage_body
from .signed_turns import TurnSigner, model_identity
from .store import StoredResponse, responses_of, store_of
from .stream import ResponseEvents


def _signer(host) -> TurnSigner:
    info = host.engine.info
    return TurnSigner(responses_of(host.server).turn_secret, model_identity(info.arch, info.n_vocab, info.n_params))


def _as_chat(host, key: str, body: dict, signer: TurnSigner):
    """(the Responses parameters, the tenant, the whole conversation, it as chat parameters)."""
    if isinstance(body.get("input"), list):  # before any item is parsed
        check_conversation(host.config, len(body["input"]), "input")
    params = parse_responses(body, host.engine.info.n_vocab, host.config.sampling, signer.verify)
    tenant = host.server.tenant(key, params.gen.tenant_hint)
    history = store_of(host.server).get(tenant, params.previous_response_id).messages if params.previous_response_id else []
    conversation = history + params.messages
    check_conversation(host.config, len(conversation), "input")
    messages = chat_messages(params.instructions, [], conversation)
    chat = ChatParams(
        messages=parse_messages(messages),
        gen=params.gen,
        tools=params.tools.chat,
        tool_choice=params.tool_choice,
        parallel_tool_calls=params.parallel_tool_calls,
        response_format=params.response_format,
        exact_turns={i: m[EXACT_KEY] for i, m in enumerate(messages) if EXACT_KEY in m},
    )
    return params, tenant, conversation, chat


async def input_tokens(request: Request) -> Response:
    """POST /v1/responses/input_tokens (OpenAI's): the prompt tokens the same body would take,
    rendered and tokenized as a response to it would be (previous_response_id included)."""
    host, key, body = await open_request(request)
    _params, _tenant, _conversation, chat = _as_chat(host, key, body, _signer(host))
    plan = await host.server.offload(pipeline.plan_chat, host, chat, -1, request=request)
    return JSONResponse({"object": "response.input_tokens", "input_tokens": len(plan.prompt.tokens)})


async def create_response(request: Request) -> Response:
    host, key, body = await open_request(request)
    signer = _signer(host)
    params, tenant, conversation, chat = _as_chat(host, key, body, signer)
    budget = host.config.reasoning_budget  # --reasoning-budget (the API's reasoning.effort is not mapped)
    generation = await pipeline.start_chat(request, host, key, chat, budget=budget, endpoint="responses", prompt_param="input")
    resp_id = f"resp_{generation.id}"
    skeleton = functools.partial(response_body, resp_id, generation.created, host.model_name, params)
    with_logprobs = params.gen.logprobs is not None
    prompt = generation.prompts[0]
    digest = prompt_digest(prompt)
    at = generation.prompt.generation_start if generation.prompt is not None else None
    head = tuple(prompt[at:]) if at is not None else ()  # the generation prompt that ends it

    def turn(tokens: list[int]) -> ExactTurn:  # the reply as generated, after this prompt
        return ExactTurn(len(prompt), digest, tuple(tokens), head)

    def keep(body: dict, items: list[dict], tokens: list[int]) -> None:
        if params.store:
            message = items_message(items, params.tools, turn(tokens))
            store_of(host.server).put(tenant, resp_id, StoredResponse(body, conversation + [message]))

    sign = (lambda tokens: signer.sign(turn(tokens))) if params.encrypted_reasoning else None
    if params.gen.stream:
        events = ResponseEvents(skeleton, host.engine.vocab, with_logprobs, keep, params.tools, sign)
        return pipeline.sse_response(generation, events)
    reply = await generation.collect(request)
    choice = reply.choices[0]
    logprobs = chat_content(host.engine.vocab, choice.logprobs) if with_logprobs else None
    items = output_items(choice.parsed, logprobs, params.tools, sign(choice.tokens) if sign is not None else None)
    incomplete = "max_output_tokens" if choice.truncated else None
    out = skeleton(
        status="incomplete" if incomplete else "completed", output=items,
        usage=usage_body(reply.usage, reply.reasoning_tokens), incomplete=incomplete,
    )
    keep(out, items, choice.tokens)
    return JSONResponse(out, headers=generation.headers)


def _stored(request: Request):
    server = server_of(request)
    key = server.authorize(request)
    hint = request.query_params.get("cache_salt") or request.query_params.get("user") or ""
    return server, server.tenant(key, hint), request.path_params["response_id"]


async def get_response(request: Request) -> Response:
    server, tenant, resp_id = _stored(request)
    return JSONResponse(store_of(server).get(tenant, resp_id, param="response_id").body)


async def delete_response(request: Request) -> Response:
    server, tenant, resp_id = _stored(request)
    store_of(server).delete(tenant, resp_id)
    return JSONResponse({"id": resp_id, "object": "response", "deleted": True})
