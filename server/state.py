"""Server-wide state: the engine, the prompt builder, settings, authentication and tenants."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import hashlib
import hmac
import logging
import os
import secrets
import time

from starlette.requests import Request

from warmslot.slots import Engine, GenerateRequest

from . import responses
from .bridge import AsyncSink, Submission
from .chat import ChatTemplate, PromptBuilder, choose_template, detect_format, detect_reasoning
from .config import ServerConfig
from .errors import ServerError, Unauthorized, Unavailable
from .protocol import GenerationParams, parse_body
from .response_store import ResponseStore

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
        self.responses = ResponseStore(config.responses_store)  # for previous_response_id

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
        req = self.make_request(tokens, gen, key, grammar, boundaries, AsyncSink(asyncio.get_running_loop()))
        return Submission.submit(self.engine, req, req.sink, self.engine.info.n_ctx_slot)

    def make_request(
        self, tokens: list[int], gen: GenerationParams, key: str, grammar, boundaries, sink, *, choice: int = 0, sibling_of=None
    ) -> GenerateRequest:
        """The engine request for one choice of a generation request (`choice` > 0: another
        choice of the same prompt, sampled with seed + choice when a seed is given)."""
        sampling = gen.sampling
        if grammar is not None:
            sampling.grammar = grammar
        if choice:
            seed = None if sampling.seed is None else sampling.seed + choice
            sampling = dataclasses.replace(sampling, seed=seed)
        return GenerateRequest(
            id=secrets.token_hex(12),
            tokens=tokens,
            sink=sink,
            sampling=sampling,
            # the engine stops at the slot's context; None: nothing else stops it
            max_tokens=gen.max_tokens if gen.max_tokens is not None else (self.config.n_predict if self.config.n_predict >= 0 else None),
            stop=gen.stop,
            ignore_eos=gen.ignore_eos,
            tenant=self.tenant(key, gen.tenant_hint),
            reuse_prefix=gen.cache_prompt,
            boundaries=tuple(boundaries),
            logprobs=gen.logprobs,
            sibling_of=sibling_of,
        )

    def envelope(self, prefix: str, sub: Submission) -> responses.Envelope:
        return responses.Envelope(f"{prefix}-{sub.req.id}", int(time.time()), self.model_name, f"ws-{self.engine.info.fingerprint[:10]}")


def server_of(request: Request) -> Warmslot:
    return request.app.state.warmslot


async def open_request(request: Request) -> tuple[Warmslot, str, dict]:
    """The server, the API key used and the JSON body of a generation request."""
    server = server_of(request)
    key = server.authorize(request)
    server.require_ready()
    return server, key, parse_body(await request.body())
