"""The server's state: the whole server's (`Server`: settings, authentication and tenants, the
work pools, the models) and each model's (`ModelHost`: its engine, prompt builder and output
formats)."""

from __future__ import annotations

import collections
import contextlib
import concurrent.futures
import hashlib
import hmac
import logging
import os
import time
from typing import Any, TypeVar

from starlette.requests import Request

from warmslot.slots import NO_ADAPTERS, AdapterSet, Engine, VocabClosed

from .prompt.builder import PromptBuilder
from .prompt.template import ChatTemplate, choose_template, detect_format
from .process.config import ServerConfig
from .errors import InvalidRequest, ServerError, Unauthorized, Unavailable, shutting_down
from .models.catalog import CatalogError, parse_duration
from .models.in_use import hold
from .models.registry import Models
from .request.limits import check_body_limits
from .request.lora import adapter_set, parse_lora
from .request.protocol import parse_body
from .recent_requests import RecentRequests
from .work_queue import WorkQueue
from .request.reasoning import reasoning_mode, thinking_default, thinks
from .process.sleep import Sleeper

log = logging.getLogger("warmslot.server")


T = TypeVar("T")


class ApiStates:
    """What the APIs keep for the server's lifetime (the Responses API's stored responses),
    one typed object per API, found by its class: the API makes it and reads it, the core
    only holds it."""

    def __init__(self) -> None:
        self._held: dict[type, Any] = {}

    def put(self, state: object) -> None:
        self._held[type(state)] = state

    def get(self, kind: type[T]) -> T:
        return self._held[kind]


class ModelHost:
    """One model as the server serves it: its config, engine, prompt builder and output
    formats, and whether it is ready. `server`: the whole server's state."""

    def __init__(self, server: Server, config: ServerConfig, engine: Engine) -> None:
        self.server = server
        self.config = config
        self.engine = engine
        self.builder: PromptBuilder | None = None
        self.model_name = config.alias or os.path.basename(config.engine.model_path) or "model"
        self.created = int(time.time())
        self.tool_format = "hermes"
        self.reasoning = (False, False)  # (split thoughts off, the generation prompt opens them)
        self.thinks = False  # replies may think (a --reasoning-budget applies)
        self.init_error: BaseException | None = None
        # the vocabulary's longest token in bytes, measured at the first load (a property of
        # the model file: a wake from --sleep-idle-seconds reloads the same one)
        self.longest_piece: int | None = None
        # the LoRA adapters' scales for requests that name none (--lora, --lora-scaled; POST
        # /lora-adapters sets them), by id; one list, replaced whole, read by any request
        self.lora_scales: tuple[float, ...] = tuple(scale for _, scale in config.engine.lora)
        self.sleeper = Sleeper(  # --sleep-idle-seconds
            engine, config.sleep_idle_s, ready=lambda: self.ready, rebuild=self.finish_loading,
        ) if config.sleep_idle_s > 0 else None

    # -- readiness --------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self.builder is not None

    def finish_loading(self) -> None:
        """After the engine loaded the model: choose the chat template and output parsers."""
        engine = self.engine
        engine.wait_ready()
        vocab, info = engine.vocab, engine.info
        name, source, native = choose_template(self.config.chat_template, info.chat_template, info.arch, vocab.is_one_token)
        template = ChatTemplate(
            name, source, vocab.special_text(vocab.bos), vocab.special_text(vocab.eos),
            thinking_default(self.config.reasoning_default, source) + tuple(self.config.chat_template_kwargs.items()), native,
        )
        fmt = self.config.tool_format
        self.tool_format = detect_format(source) if fmt == "auto" else fmt
        self.reasoning = reasoning_mode(self.config.reasoning_format, source)
        self.thinks = thinks(self.config.reasoning_format, source)
        # a prompt longer than a slot can never run: the builder stops counting there
        # NOTE: measured before the server is ready, not on a thread beside the first
        # requests: on 2 cores that thread took the GIL and a core from the first decodes
        if self.longest_piece is None:
            with contextlib.suppress(VocabClosed):  # a shutdown while loading: the token count decides
                self.longest_piece = vocab.longest_piece()
        self.builder = PromptBuilder(template, vocab, max_tokens=info.n_ctx_slot, longest_piece=self.longest_piece)
        log.info(
            "ready: chat template %s (tools %s), tool-call format %s, reasoning split %s",
            name, "native" if template.supports_tools else "injected", self.tool_format, "on" if self.reasoning[0] else "off",
        )

    def renew_engine(self) -> None:
        """A fresh engine on the same settings, not started (its model failed to load)."""
        self.engine = Engine(self.config.engine)
        self.builder = None

    def adapters_of(self, requested) -> AdapterSet:
        """The LoRA adapter set of a request whose `lora` field is `requested` (None: absent):
        400 where it names no loaded adapter or is not llama-server's shape."""
        if requested is None and not self.config.engine.lora:
            return NO_ADAPTERS
        adapters = self.engine.info.adapters
        return adapter_set(parse_lora(requested, len(adapters)) if requested is not None else None, self.lora_scales, adapters)

    def require_ready(self) -> None:
        if self.init_error is not None:
            raise ServerError(f"the model failed to load: {self.init_error}")
        if self.server.draining:
            raise shutting_down()
        several = self.server.models is not None
        if several and (not self.engine.started or (self.engine.asleep and self.sleeper is None)):
            raise Unavailable("the model is not loaded: a request naming it loads it", retry_after=5, code="model_unloaded")
        if not self.ready:
            raise Unavailable("the model is loading", retry_after=5, code="loading")


class Server:
    """The whole server's state: settings, authentication and tenants, the work pools, the
    recent requests, what each API keeps, and the models.

    `default` serves the model of a server with one; a server with several models
    (`--models-dir`, `--models-file`) has a `ModelHost` each, in the registry (`models`), and
    `default` is the `--models-default` one (else the first), whose config is the server's
    (`config`: the flags of the whole server are every model's)."""

    def __init__(self, config: ServerConfig, engine: Engine) -> None:
        self.config = config
        self.default = ModelHost(self, config, engine)
        self.models: Models | None = None  # several models by name (set by the app); None: one model
        self.draining = False  # shutting down: no new requests (see drain.py)
        self.recent = RecentRequests()  # the last requests' summaries, for the admin (/engine/requests)
        self.slot_file_rejected: collections.Counter = collections.Counter()  # by reason, for /metrics
        self.tokenize_pool = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="warmslot-tokenize")
        self.tokenize_queue = WorkQueue("tokenize pool", lambda: self.config.engine.max_queue)
        self.embed_queue = WorkQueue("embeddings worker", lambda: self.config.engine.max_queue)
        self.apis = ApiStates()

    def hosts(self) -> list[ModelHost]:
        """Every model's host (one without a registry)."""
        return self.models.hosts() if self.models is not None else [self.default]

    # -- auth and tenants ---------------------------------------------------------------

    def authorize(self, request: Request) -> str:
        """The key the request used: an API key or the admin key. Without API keys every
        request may pass (as "" unless it shows the admin key). Raises 401."""
        header = request.headers.get("authorization", "")
        given = header[7:].strip() if header[:7].lower() == "bearer " else request.headers.get("x-api-key", "")
        known = [*self.config.api_keys, *([self.config.admin_key] if self.config.admin_key else [])]
        found = ""
        for key in known:  # every key is compared, so the time says nothing of which matched
            if given and hmac.compare_digest(given.encode(), key.encode()):
                found = key
        if found or not self.config.api_keys:
            return found
        raise Unauthorized()

    def is_admin(self, key: str) -> bool:
        """The admin key (--admin-key, else the first API key) sees every tenant on /slots and /engine."""
        admin = self.config.admin_key or (self.config.api_keys[0] if self.config.api_keys else None)
        return admin is None or key == admin

    @staticmethod
    def owner(key: str) -> str:
        """The part of a tenant that names the key ("" without a key)."""
        return hashlib.sha256(b"owner\0" + key.encode()).hexdigest()[:12] if key else ""

    @classmethod
    def tenant(cls, key: str, hint: str) -> str:
        """Prefixes are shared only within a tenant: the API key plus cache_salt (or user).
        Written `owner:salt`, so that /slots and /engine can show a key all of its own tenants."""
        if not key and not hint:
            return ""
        salted = hashlib.sha256(f"{key}\0{hint}".encode()).hexdigest()[:16] if hint else ""
        return f"{cls.owner(key)}:{salted}"

    def visible_tenants(self, key: str):
        """Which tenants' slots and cache entries a key may see on /slots and /engine (None: all)."""
        if self.is_admin(key):
            return None
        owner = self.owner(key)
        return lambda tenant: tenant.split(":", 1)[0] == owner

    # -- work off the event loop ------------------------------------------------------

    async def offload(self, fn, *args, request: Request | None = None, deadline: float | None = None):
        """`fn(*args)` on the tokenize pool (template rendering, tokenization, grammar
        building): CPU work that must not stall the event loop.

        Waiting there counts against --max-queue (503 `queue_full` past it). `request`: its
        client leaving drops the work (or ignores its result once running) and raises
        ClientClosed (499). `deadline` (time.monotonic(); default: --request-timeout from
        now) bounds the wait with a 408."""
        if deadline is None:
            deadline = self.deadline(None)
        pool = self.tokenize_pool
        return await self.tokenize_queue.run(lambda job: pool.submit(job.call, fn, *args), request=request, deadline=deadline)

    def close_queues(self) -> None:
        """Shutting down: work waiting for (or running on) the tokenize pool and the
        embeddings worker is given up, and its requests answer 503 `shutting_down`."""
        self.tokenize_queue.close()
        self.embed_queue.close()
        self.tokenize_pool.shutdown(wait=False, cancel_futures=True)

    # -- generation --------------------------------------------------------------------

    def time_limit(self, timeout: float | None) -> float | None:
        """How long a request may take: its own `timeout`, at most --request-timeout."""
        limits = [t for t in (timeout, self.config.request_timeout) if t]
        return min(limits) if limits else None

    def deadline(self, timeout: float | None) -> float | None:
        """When a request arriving now must end (see `time_limit`)."""
        limit = self.time_limit(timeout)
        return time.monotonic() + limit if limit is not None else None


def server_of(request: Request) -> Server:
    return request.app.state.warmslot


async def open_model(request: Request) -> tuple[ModelHost, str, dict]:
    """The model (the one the body's `model` names, loaded, where there are several), the API
    key used and the JSON body."""
    server = server_of(request)
    key = server.authorize(request)
    if server.models is None:
        server.default.require_ready()
        return server.default, key, parse_body(await request.body())
    if server.draining:
        raise shutting_down()
    body = parse_body(await request.body())
    host = await use_model(request, body.get("model"), body.get("keep_alive"))
    host.require_ready()
    return host, key, body


async def open_request(request: Request) -> tuple[ModelHost, str, dict]:
    """`open_model` for a generation request: the body within the request limits."""
    host, key, body = await open_model(request)
    check_body_limits(host.config, body)
    return host, key, body


def named_model(request: Request, wanted: Any) -> ModelHost:
    """The model `wanted` names, as it stands (a read loads nothing); with one model, that
    model whatever the name."""
    server = server_of(request)
    return server.models.resolve(wanted).host if server.models is not None and wanted else server.default


async def use_model(request: Request, wanted: Any, keep_alive: Any = None) -> ModelHost:
    """The model `wanted` names, loaded (see `Models.acquire`); it counts the
    request in flight until its response is sent (`models.in_use.ModelsInUse`). `keep_alive`:
    the request's own (Ollama's: seconds, or a duration such as "5m"; 0 unloads the model
    once the request ends)."""
    models = server_of(request).models
    assert models is not None
    entry = models.resolve(wanted)
    try:
        keep = None if keep_alive is None else parse_duration(keep_alive, "keep_alive")
    except CatalogError as exc:
        raise InvalidRequest(str(exc), param="keep_alive") from None
    served = await models.acquire(entry)
    hold(request.scope, models, entry, keep)
    return served
