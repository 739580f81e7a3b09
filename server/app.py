"""The Starlette application: routes, authentication, errors and streaming.

Handlers parse and validate, build the prompt off the event loop, submit token ids to the
engine and turn its events into OpenAI bodies or SSE chunks. Errors are typed (`ApiError`)
and become OpenAI error bodies in one exception handler. Once an SSE stream has sent its
first byte the status cannot change, so a later error goes inside the stream, which still
ends with [DONE].
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import hashlib
import hmac
import json
import logging
import os
import secrets
import time
from dataclasses import dataclass

from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from warmslot.slots import Engine, FinishReason, GenerateRequest, GrammarSpec

from . import explain, metrics, responses
from .bridge import AsyncSink, ClientGone, Submission
from .chat import ChatTemplate, Prompt, PromptBuilder, choose_template, detect_format, detect_reasoning, prompt_opens_reasoning
from .config import ServerConfig
from .errors import ApiError, InvalidRequest, MethodNotAllowed, NotFound, ServerError, Unauthorized, Unavailable
from .gbnf.response_format import json_schema_grammar
from .gbnf.tools import tool_call_grammar
from .output.events import ReasoningDelta, ToolCallDelta
from .output.parser import OutputParser
from .protocol import (
    ChatParams,
    GenerationParams,
    ToolChoice,
    parse_body,
    parse_chat,
    parse_completion,
    parse_messages,
    parse_response_format,
    validate_tool_choice,
    validate_tools,
)

log = logging.getLogger("warmslot.server")


class Warmslot:
    """Server-wide state: the engine, the prompt builder and the settings."""

    def __init__(self, config: ServerConfig, engine: Engine) -> None:
        self.config = config
        self.engine = engine
        self.builder: PromptBuilder | None = None
        self.model_name = config.alias or os.path.basename(config.engine.model_path) or "model"
        self.created = int(time.time())
        self.tool_format = "hermes"
        self.reasoning = (False, False)
        self.init_error: BaseException | None = None
        self.tokenize_pool = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="warmslot-tokenize")

    # -- readiness --------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self.builder is not None

    def finish_loading(self) -> None:
        """After the engine loaded the model: choose the chat template and output parsers."""
        engine = self.engine
        engine.wait_ready()
        vocab, info = engine.vocab, engine.info
        name, source = choose_template(self.config.chat_template, info.chat_template, info.arch, vocab.is_one_token)
        template = ChatTemplate(name, source, vocab.special_text(vocab.bos), vocab.special_text(vocab.eos))
        fmt = self.config.tool_format
        self.tool_format = detect_format(source) if fmt == "auto" else fmt
        self.reasoning = detect_reasoning(source) if self.config.reasoning_format == "auto" else (False, False)
        self.builder = PromptBuilder(template, vocab)
        log.info(
            "ready: chat template %s (tools %s), tool-call format %s, reasoning split %s",
            name, "native" if template.supports_tools else "injected", self.tool_format, "on" if self.reasoning[0] else "off",
        )

    def require_ready(self) -> None:
        if self.init_error is not None:
            raise ServerError(f"the model failed to load: {self.init_error}")
        if not self.ready:
            raise Unavailable("the model is loading", retry_after=5, code="loading")

    # -- auth and tenants ---------------------------------------------------------------

    def authorize(self, request: Request) -> str:
        """The API key the request used ("" when the server has none). Raises 401."""
        keys = self.config.api_keys
        if not keys:
            return ""
        header = request.headers.get("authorization", "")
        given = header[7:].strip() if header[:7].lower() == "bearer " else request.headers.get("x-api-key", "")
        for key in keys:
            if given and hmac.compare_digest(given.encode(), key.encode()):
                return key
        raise Unauthorized()

    @staticmethod
    def tenant(key: str, hint: str) -> str:
        """Prefixes are shared only within a tenant: the API key plus cache_salt (or user)."""
        if not key and not hint:
            return ""
        return hashlib.sha256(f"{key}\0{hint}".encode()).hexdigest()[:16]

    # -- generation --------------------------------------------------------------------

    def submit(self, tokens: list[int], gen: GenerationParams, key: str, grammar=None, boundaries=()) -> Submission:
        sampling = gen.sampling
        if grammar is not None:
            sampling.grammar = grammar
        req = GenerateRequest(
            id=secrets.token_hex(12),
            tokens=tokens,
            sink=AsyncSink(asyncio.get_running_loop()),
            sampling=sampling,
            # the engine stops at the slot's context; None: nothing else stops it
            max_tokens=gen.max_tokens if gen.max_tokens is not None else (self.config.n_predict if self.config.n_predict >= 0 else None),
            stop=gen.stop,
            ignore_eos=gen.ignore_eos,
            tenant=self.tenant(key, gen.tenant_hint),
            reuse_prefix=gen.cache_prompt,
            boundaries=tuple(boundaries),
        )
        return Submission.submit(self.engine, req, req.sink, self.engine.info.n_ctx_slot)

    def envelope(self, prefix: str, sub: Submission) -> responses.Envelope:
        return responses.Envelope(f"{prefix}-{sub.req.id}", int(time.time()), self.model_name, f"ws-{self.engine.info.fingerprint[:10]}")


def _server(request: Request) -> Warmslot:
    return request.app.state.warmslot


def _finish_reason(reason: FinishReason | None, has_tool_calls: bool) -> str:
    if has_tool_calls:
        return "tool_calls"
    return "length" if reason is FinishReason.LENGTH else "stop"


# -- handlers -----------------------------------------------------------------------------


async def health(request: Request) -> Response:
    server = _server(request)
    if server.init_error is not None:
        return JSONResponse({"status": "error", "error": {"message": str(server.init_error), "type": "server_error"}}, 500)
    if not server.ready:
        return JSONResponse(
            {"status": "loading", "progress": round(server.engine.load_progress, 3), "error": {"message": "the model is loading", "type": "unavailable_error", "code": "loading"}},
            503,
            headers={"Retry-After": "5"},
        )
    return JSONResponse({"status": "ok"})


async def models(request: Request) -> Response:
    server = _server(request)
    data = [{"id": server.model_name, "object": "model", "created": server.created, "owned_by": "warmslot"}]
    if server.ready:
        info = server.engine.info
        data[0]["meta"] = {
            "arch": info.arch,
            "n_params": info.n_params,
            "size": info.size_bytes,
            "n_ctx_train": info.n_ctx_train,
            "n_ctx": info.n_ctx,
            "n_vocab": info.n_vocab,
            "memory": info.memory.value,
        }
    return JSONResponse({"object": "list", "data": data})


async def _open(request: Request) -> tuple[Warmslot, str, dict]:
    """The server, the API key used and the JSON body of a generation request."""
    server = _server(request)
    key = server.authorize(request)
    server.require_ready()
    return server, key, parse_body(await request.body())


async def chat_completions(request: Request) -> Response:
    server, key, body = await _open(request)
    params = parse_chat(body, server.engine.info.n_vocab, server.config.sampling)
    plan = await asyncio.get_running_loop().run_in_executor(server.tokenize_pool, _plan_chat, server, params)
    prompt = plan.prompt
    sub = server.submit(prompt.tokens, params.gen, key, plan.grammar, _checkpoint_boundaries(prompt))
    started = await _started(sub, request)
    parser = OutputParser(
        format=server.tool_format,
        reasoning=server.reasoning[0],
        starts_in_reasoning=plan.opens_reasoning,
        tools_enabled=plan.tools is not None,
        tools=plan.tools,
    )
    env = server.envelope("chatcmpl", sub)
    n_prompt = len(prompt.tokens)
    headers = explain.header(started.reuse, n_prompt, prompt)
    done = functools.partial(_log_request, "chat", started.reuse, prompt)
    if params.gen.stream:
        sub.stop_watching()
        return EventSourceResponse(_chat_stream(server, sub, env, parser, params.gen, done), headers=headers, ping=15)
    result_text, usage, finish = await _collect(sub, request)
    done(usage)
    parsed = parser.parse_complete(result_text)
    message = responses.chat_message(parsed.content, parsed.reasoning_content, parsed.tool_calls)
    reasoning_tokens = await _count_tokens(server, parsed.reasoning_content)
    body = responses.chat_response(env, message, _finish_reason(finish, bool(parsed.tool_calls)), usage, reasoning_tokens)
    if params.gen.explain_cache:
        body["warmslot"] = {"cache": explain.explanation(started.reuse, n_prompt, prompt)}
    return JSONResponse(body, headers=headers)


async def completions(request: Request) -> Response:
    server, key, body = await _open(request)
    params = parse_completion(body, server.engine.info.n_vocab, server.config.sampling)
    if isinstance(params.prompt, str):
        tokens = await asyncio.get_running_loop().run_in_executor(
            server.tokenize_pool, server.builder.tokenizer.prompt, params.prompt
        )
    else:
        tokens = list(params.prompt)
    if not tokens:
        raise InvalidRequest("the prompt has no tokens", param="prompt")
    sub = server.submit(tokens, params.gen, key)
    started = await _started(sub, request)
    env = server.envelope("cmpl", sub)
    headers = explain.header(started.reuse, len(tokens), None)
    done = functools.partial(_log_request, "completion", started.reuse, None)
    if params.gen.stream:
        sub.stop_watching()
        return EventSourceResponse(_completion_stream(sub, env, params.gen, done), headers=headers, ping=15)
    text, usage, finish = await _collect(sub, request)
    done(usage)
    body = responses.completion_response(env, text, _finish_reason(finish, False), usage)
    if params.gen.explain_cache:
        body["warmslot"] = {"cache": explain.explanation(started.reuse, len(tokens), None)}
    return JSONResponse(body, headers=headers)


@dataclass(slots=True)
class ChatPlan:
    """What a chat request needs before it is submitted."""

    prompt: Prompt
    tools: list[dict] | None  # the tools offered to the model (None: no tool calls)
    opens_reasoning: bool  # the prompt leaves a think block open
    grammar: GrammarSpec | None


def _plan_chat(server: Warmslot, params: ChatParams) -> ChatPlan:
    """Validate the tools, build the prompt and the grammar. Runs on the tokenize pool: schema
    conversion, template rendering and grammar checks can take a while."""
    tools = validate_tools(params.tools) if params.tools is not None else []
    choice = validate_tool_choice(params.tool_choice, tools)
    offered = tools if tools and choice.mode != "none" else None
    prompt = server.builder.build(params.messages, offered, extra=params.template_kwargs)
    reasoning = server.reasoning[0]
    opens = reasoning and prompt_opens_reasoning(prompt.text)
    grammar = _grammar(server, params, offered, choice, reasoning, opens)
    return ChatPlan(prompt, offered, opens, grammar)


def _grammar(
    server: Warmslot, params: ChatParams, tools: list[dict] | None, choice: ToolChoice, reasoning: bool, opens: bool
) -> GrammarSpec | None:
    """The grammar that constrains the output (tool_choice, response_format), if any."""
    spec = None
    if tools:
        spec = tool_call_grammar(
            tools, choice, server.tool_format, parallel_tool_calls=params.parallel_tool_calls,
            reasoning=reasoning, starts_in_reasoning=opens,
        )
    response = parse_response_format(params.response_format)
    if response is not None:
        json_spec = json_schema_grammar(response.schema, response.param, reasoning=reasoning, starts_in_reasoning=opens)
        if spec is not None and not spec.lazy:
            raise InvalidRequest("response_format cannot be combined with a required tool call", param="response_format")
        spec = json_spec if spec is None else spec
    return spec


def _checkpoint_boundaries(prompt) -> list[int]:
    """Where agent histories diverge: the end of the system+tools prefix (the content start
    of the first non-system message), the start of every user or tool message, and the start
    of the generation prompt (templates often render the previous turn's generation prompt
    differently once the reply is in the history, e.g. adding an empty think block)."""
    out = []
    seen_non_system = False
    for role, _glue, content in prompt.messages:
        if role != "system" and not seen_non_system:
            seen_non_system = True
            out.append(content)
        elif role in ("user", "tool"):
            out.append(content)
    if prompt.generation_start is not None:
        out.append(prompt.generation_start)
    return sorted({b for b in out if 0 < b < len(prompt.tokens)})


async def _started(sub: Submission, request: Request):
    try:
        return await sub.started(request.receive)
    except ClientGone:
        raise _Gone() from None


class _Gone(Exception):
    """The client left before the response started; nothing to send."""


async def _collect(sub: Submission, request: Request):
    text, usage, finish = [], None, None
    try:
        async for ev in sub.events(request.receive):
            text.append(ev.text)
            if ev.finish is not None:
                usage, finish = ev.usage, ev.finish
    except ClientGone:
        raise _Gone() from None
    return "".join(text), usage, finish


def _log_request(endpoint: str, reuse, prompt, usage) -> None:
    if usage is not None:
        log.info("%s", explain.log_line(endpoint, reuse, usage, prompt))


async def _count_tokens(server: Warmslot, text: str | None) -> int:
    if not text:
        return 0
    tokens = await asyncio.get_running_loop().run_in_executor(server.tokenize_pool, server.builder.tokenizer.raw, text)
    return len(tokens)


async def _chat_stream(server: Warmslot, sub: Submission, env, parser, gen: GenerationParams, done):
    try:
        yield responses.chat_chunk(env, {"role": "assistant", "content": ""})
        has_calls = False
        reasoning: list[str] = []
        async for ev in sub.events():
            outputs = parser.feed(ev.text) if ev.text else []
            if ev.finish is not None:
                outputs += parser.finish()
            for out in outputs:
                has_calls |= isinstance(out, ToolCallDelta)
                if isinstance(out, ReasoningDelta):
                    reasoning.append(out.text)
                yield responses.chat_chunk(env, responses.delta_body(out))
            if ev.finish is not None:
                done(ev.usage)
                yield responses.chat_chunk(env, {}, _finish_reason(ev.finish, has_calls), ev.usage)
                if gen.include_usage:
                    n_reasoning = await _count_tokens(server, "".join(reasoning))
                    yield responses.usage_chunk(env, ev.usage, reasoning_tokens=n_reasoning)
        yield "[DONE]"
    except ApiError as exc:
        yield json.dumps(exc.body())
        yield "[DONE]"


async def _completion_stream(sub: Submission, env, gen: GenerationParams, done):
    try:
        async for ev in sub.events():
            if ev.text:
                yield responses.completion_chunk(env, ev.text)
            if ev.finish is not None:
                done(ev.usage)
                yield responses.completion_chunk(env, "", _finish_reason(ev.finish, False), ev.usage)
                if gen.include_usage:
                    yield responses.usage_chunk(env, ev.usage, "text_completion")
        yield "[DONE]"
    except ApiError as exc:
        yield json.dumps(exc.body())
        yield "[DONE]"


async def tokenize(request: Request) -> Response:
    """Tokens the server would evaluate: for `content` (a text prompt, as /v1/completions
    tokenizes it) or for `messages` (and `tools`), as /v1/chat/completions renders them."""
    server = _server(request)
    server.authorize(request)
    server.require_ready()
    body = parse_body(await request.body())
    loop = asyncio.get_running_loop()
    if "messages" in body:
        messages = parse_messages(body["messages"])
        tools = body.get("tools")
        prompt = await loop.run_in_executor(
            server.tokenize_pool, lambda: server.builder.build(messages, validate_tools(tools) if tools else None)
        )
        spans = [{"role": role, "start": glue, "content_start": content} for role, glue, content in prompt.messages]
        return JSONResponse({"tokens": prompt.tokens, "messages": spans})
    content = body.get("content")
    if not isinstance(content, str):
        raise InvalidRequest("send 'content' (a string) or 'messages'", param="content")
    add_special = body.get("add_special", True)
    if not isinstance(add_special, bool):
        raise InvalidRequest("'add_special' must be a boolean", param="add_special")
    tokens = await loop.run_in_executor(
        server.tokenize_pool, lambda: server.engine.vocab.tokenize(content, add_special=add_special, parse_special=True)
    )
    return JSONResponse({"tokens": tokens})


async def detokenize(request: Request) -> Response:
    server = _server(request)
    server.authorize(request)
    server.require_ready()
    body = parse_body(await request.body())
    tokens = body.get("tokens")
    n_vocab = server.engine.info.n_vocab
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < n_vocab for t in tokens):
        raise InvalidRequest(f"'tokens' must be a list of token ids (0..{n_vocab - 1})", param="tokens")
    text = await asyncio.get_running_loop().run_in_executor(server.tokenize_pool, server.engine.vocab.detokenize, tokens)
    return JSONResponse({"content": text})


async def slots_view(request: Request) -> Response:
    server = _server(request)
    server.authorize(request)
    if not server.config.slots_endpoint:
        raise NotFound("the /slots endpoint is disabled (--no-slots)")
    server.require_ready()
    snapshot = await asyncio.get_running_loop().run_in_executor(None, lambda: server.engine.snapshot(detail=True))
    return JSONResponse(snapshot.to_json())


# -- errors -------------------------------------------------------------------------------


async def _api_error(request: Request, exc: ApiError) -> Response:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    if exc.status_code == 404:
        err: ApiError = NotFound(f"no route {request.method} {request.url.path}")
    elif exc.status_code == 405:
        err = MethodNotAllowed(f"{request.method} is not allowed on {request.url.path}")
    else:
        err = ApiError(str(exc.detail))
        err.status = exc.status_code
    return JSONResponse(err.body(), status_code=err.status)


async def _gone(request: Request, exc: _Gone) -> Response:
    return Response(status_code=499)


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return JSONResponse(ServerError(f"internal error: {type(exc).__name__}").body(), status_code=500)


def create_app(config: ServerConfig, engine: Engine | None = None, on_fatal=None) -> Starlette:
    """The app. The engine starts loading when the app starts; /health says when it is ready.

    `on_fatal(exc)` is called (from a worker thread) when the model cannot be loaded."""
    engine = engine or Engine(config.engine)
    server = Warmslot(config, engine)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        if not engine.started:
            engine.start()
        loader = asyncio.get_running_loop().run_in_executor(None, _finish_loading, server, on_fatal)
        try:
            yield
        finally:
            loader.cancel()
            await asyncio.get_running_loop().run_in_executor(None, engine.stop)
            server.tokenize_pool.shutdown(wait=False)

    routes = [
        Route("/health", health),
        Route("/v1/health", health),
        Route("/v1/models", models),
        Route("/models", models),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/completions", completions, methods=["POST"]),
        Route("/slots", slots_view),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        Route("/metrics", metrics.metrics_endpoint),
    ]
    request_counts: collections.Counter = collections.Counter()
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        middleware=[Middleware(metrics.RequestCounter, counts=request_counts)],
        exception_handlers={
            ApiError: _api_error,
            HTTPException: _http_error,
            _Gone: _gone,
            Exception: _unexpected,
        },
    )
    app.state.warmslot = server
    app.state.metrics_registry = metrics.make_registry(server, request_counts)
    return app


def _finish_loading(server: Warmslot, on_fatal) -> None:
    try:
        server.finish_loading()
    except BaseException as exc:  # noqa: BLE001 - reported by /health and every request
        log.error("the server cannot serve: %s", exc)
        server.init_error = exc
        if on_fatal is not None:
            on_fatal(exc)
