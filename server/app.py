"""The Starlette application: the route table, errors and the engine's lifetime.

Errors are typed (`ApiError`) and become OpenAI error bodies in one exception handler; any
other exception becomes an OpenAI-shaped 500 in `guard.ErrorGuard`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from warmslot.slots import Engine

from . import metrics, openapi
from .process.config import ServerConfig
from .middleware.cors import Cors
from .errors import ApiError, MethodNotAllowed, NotFound
from .middleware.guard import BodyLimit, ErrorGuard, error_shape, register_error_shape
from .openapi import openapi_endpoint
from .api.chat import openapi as chat_openapi
from .api.chat.route import chat_completions, input_tokens
from .api.completions import openapi as completions_openapi
from .api.completions.route import completions
from .api.responses import openapi as responses_openapi
from .api.responses import route as responses
from .api.responses.store import attach_store
from .api.messages import errors as messages_errors
from .api.messages import openapi as messages_openapi
from .api.messages import route as messages
from .api.native import openapi as native_openapi
from .api.native import route as native
from .api.native.infill import infill
from .api.embeddings import openapi as embeddings_openapi
from .api.embeddings import route as embeddings
from .routes import openapi as service_openapi
from .routes import lora_adapters, props, service, slot_files, webui, worker
from .api.rerank import openapi as rerank_openapi
from .api.rerank import route as rerank
from .api.vertex import route as vertex
from .process.sleep import WakeOnRequest
from .models.capacity import capacity_view
from .models.capacity import table as capacity_table
from .models.catalog import ModelSpec
from .models.in_use import ModelsInUse
from .models.registry import ModelEntry, Models
from .routes import model_admin
from .state import ModelHost, Server

log = logging.getLogger("warmslot.server")


# -- errors -------------------------------------------------------------------------------


async def _api_error(request: Request, exc: ApiError) -> Response:
    status, body = error_shape(request.url.path, exc)
    return JSONResponse(body, status_code=status, headers=exc.headers)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    if exc.status_code == 404:
        err: ApiError = NotFound(f"no route {request.method} {request.url.path}")
    elif exc.status_code == 405:
        err = MethodNotAllowed(f"{request.method} is not allowed on {request.url.path}")
    else:
        err = ApiError(str(exc.detail))
        err.status = exc.status_code
    status, body = error_shape(request.url.path, err)
    return JSONResponse(body, status_code=status)


def _register_apis() -> None:
    """What the core needs of the APIs: each one's part of /openapi.json, and the error shape
    of those whose errors are not OpenAI's. Registering again replaces the same entries."""
    openapi.register("service", service_openapi.paths())
    openapi.register("chat", chat_openapi.paths(), chat_openapi.SCHEMAS)
    openapi.register("completions", completions_openapi.paths(), completions_openapi.SCHEMAS)
    openapi.register("native", native_openapi.paths())
    openapi.register("responses", responses_openapi.paths())
    openapi.register("messages", messages_openapi.paths())
    openapi.register("embeddings", embeddings_openapi.paths())
    openapi.register("rerank", rerank_openapi.paths())
    register_error_shape(messages_errors.PATHS, messages_errors.shaped)


def create_app(
    config: ServerConfig, engine: Engine | None = None, on_fatal=None, models: list[tuple[ModelSpec, ServerConfig]] | None = None,
) -> Starlette:
    """The app. The engine starts loading when the app starts; /health says when it is ready.

    `on_fatal(exc)` is called (from a worker thread) when the model cannot be loaded.
    `models`: several models by name, each with its config (`models.configs.model_configs`);
    none is loaded before a request names it."""
    _register_apis()
    server = _several(config, models) if models else Server(config, engine or Engine(config.engine))
    attach_store(server)  # the Responses API's stored responses (previous_response_id)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        loop = asyncio.get_running_loop()
        if server.models is None:
            if not server.default.engine.started:
                server.default.engine.start()
            loader = loop.run_in_executor(None, _finish_loading, server.default, on_fatal)
        else:
            loader = asyncio.ensure_future(server.models.watch())  # keep-alive
            try:
                view = await loop.run_in_executor(None, capacity_view, server.models)
                log.info("models (GET /models/capacity):\n%s", capacity_table(view))
            except Exception as exc:  # noqa: BLE001 - the table informs; the models load or fail on their own
                log.warning("cannot size the models: %s", exc)
        sleeper = asyncio.ensure_future(server.default.sleeper.watch()) if server.default.sleeper is not None else None
        try:
            yield
        finally:
            loader.cancel()
            if sleeper is not None:
                sleeper.cancel()
            for each in server.hosts():
                await loop.run_in_executor(None, each.engine.stop)
            server.tokenize_pool.shutdown(wait=False)

    routes = [
        Route("/health", service.health),
        Route("/v1/health", service.health),
        Route("/v1/models", props.models),
        Route("/models", props.models),
        Route("/v1/models/{model_id:path}", props.model),
        Route("/props", props.props),
        Route("/v1/props", props.props),
        Route("/version", props.version),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/chat/completions/input_tokens", input_tokens, methods=["POST"]),
        Route("/chat/completions/input_tokens", input_tokens, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/completions", native.completion, methods=["POST"]),  # llama-server's: its native shape
        Route("/completion", native.completion, methods=["POST"]),
        Route("/infill", infill, methods=["POST"]),  # llama-server's fill-in-the-middle (code editors)
        Route("/v1/responses", responses.create_response, methods=["POST"]),
        Route("/responses", responses.create_response, methods=["POST"]),
        Route("/v1/responses/input_tokens", responses.input_tokens, methods=["POST"]),
        Route("/responses/input_tokens", responses.input_tokens, methods=["POST"]),
        Route("/v1/responses/{response_id}", responses.get_response, methods=["GET"]),
        Route("/v1/responses/{response_id}", responses.delete_response, methods=["DELETE"]),
        Route("/v1/messages", messages.create_message, methods=["POST"]),
        Route("/messages", messages.create_message, methods=["POST"]),
        Route("/v1/messages/count_tokens", messages.count_tokens, methods=["POST"]),
        Route("/messages/count_tokens", messages.count_tokens, methods=["POST"]),
        Route("/v1/embeddings", embeddings.embeddings, methods=["POST"]),
        Route("/embeddings", embeddings.embeddings, methods=["POST"]),
        *(Route(path, rerank.rerank, methods=["POST"]) for path in rerank.PATHS),
        Route("/slots", service.slots_view),
        Route("/engine", service.engine_view),
        Route("/engine/requests", service.recent_requests),
        Route("/slots/{id_slot}", slot_files.slot_action, methods=["POST"]),
        Route("/lora-adapters", lora_adapters.get_adapters, methods=["GET"]),
        Route("/lora-adapters", lora_adapters.set_adapters, methods=["POST"]),
        Route("/tokenize", service.tokenize, methods=["POST"]),
        Route("/detokenize", service.detokenize, methods=["POST"]),
        Route("/apply-template", service.apply_template, methods=["POST"]),
        Route("/metrics", metrics.metrics_endpoint),
        Route("/openapi.json", openapi_endpoint),
        *worker.ROUTES,  # what a load balancer asks its replicas
        *(webui.ROUTES if config.webui else []),  # the chat and cache page (--no-webui: none)
        *(model_admin.ROUTES if server.models is not None else []),  # loading and unloading models by name
    ]
    if config.vertex is not None:  # Google Cloud's prediction protocol (AIP_MODE=PREDICTION)
        posts = [r for r in routes if isinstance(r, Route) and r.methods and "POST" in r.methods]
        routes += vertex.routes(config.vertex, posts, service.health)
    request_counts: collections.Counter = collections.Counter()
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        middleware=[
            Middleware(Cors, policy=config.cors),  # preflights answered before anything else
            Middleware(metrics.RequestCounter, counts=request_counts, endpoints={**rerank.ENDPOINTS, **worker.ENDPOINTS}),
            Middleware(ModelsInUse),  # several models: a model is in use until its response is sent
            Middleware(WakeOnRequest, sleeper=server.default.sleeper),  # --sleep-idle-seconds: a request loads the model again
            Middleware(ErrorGuard),  # unexpected errors: an OpenAI 500, the connection kept
            Middleware(BodyLimit, limit=config.max_body),
        ],
        exception_handlers={ApiError: _api_error, HTTPException: _http_error},
    )
    app.state.warmslot = server
    app.state.metrics_registry = metrics.make_registry(server, request_counts)
    app.state.metrics_window = {}  # the llamacpp: throughput gauges' counters at the last scrape
    return app


def _several(config: ServerConfig, models: list[tuple[ModelSpec, ServerConfig]]) -> Server:
    """The server with a host for each model, the default's (else the first's) its `default`,
    and the registry of them all."""
    first = next((i for i, (spec, _) in enumerate(models) if spec.name == config.models_default), 0)
    default_config = models[first][1]
    server = Server(default_config, Engine(default_config.engine))
    entries = []
    for i, (spec, model_config) in enumerate(models):
        host = server.default if i == first else ModelHost(server, model_config, Engine(model_config.engine))
        entries.append(ModelEntry(spec, host, keep_alive=spec.keep_alive))
    server.models = Models(entries, max_loaded=config.models_max, default=config.models_default,
                           load_timeout=config.models_load_timeout)
    return server


def _finish_loading(host: ModelHost, on_fatal) -> None:
    try:
        host.finish_loading()
    except BaseException as exc:  # noqa: BLE001 - reported by /health and every request
        log.error("the server cannot serve: %s", exc)
        host.init_error = exc
        if on_fatal is not None:
            on_fatal(exc)
