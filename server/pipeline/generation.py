"""One generation request from its parsed parameters to its typed events or whole reply.

`start_chat` and `start_text` plan the prompt (off the event loop), submit one engine
request per choice, and wait for admission; the `Generation` they return is then read once,
as a stream of typed events (`events`) or as the whole reply (`collect`). The rules every
API shares live here: how parsed output and logprobs line up, finish reasons, a reply cut
inside a tool call, usage over several choices, reasoning tokens, and the request's log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
import time
from typing import AsyncIterator

from starlette.requests import Request

from warmslot.slots import NO_ADAPTERS, AdapterSet, Event, FinishReason, GenerateRequest, Progress, Source, Usage

from .. import explain
from ..prompt.builder import Prompt
from ..recent_requests import summarize
from ..errors import ClientClosed, ContextOverflow
from ..output.parsed import ContentDelta, ReasoningDelta, ToolCallDelta
from ..output.reply import parse_event, parse_reply
from ..request.protocol import ChatParams, CompletionParams, GenerationParams
from ..state import ModelHost
from .events import ChoiceEnd, ChoiceReply, Delta, End, PromptProgress, Reply, StreamEvent, finish_of, total_usage
from .plan import ChatPlan, check_n, completion_tokens, echo_text, plan_chat
from .submission import Submission, TaggedSink

log = logging.getLogger("warmslot.server")


class Generation:
    """A request admitted by the engine: `n` choices for each of its prompts."""

    def __init__(
        self, host: ModelHost, endpoint: str, gen: GenerationParams, sub: Submission, started: Event,
        prompts: list[list[int]], plan: ChatPlan | None, built_s: float | None = None,
    ) -> None:
        self.host = host
        self.endpoint = endpoint  # names the request in the log
        self.gen = gen
        self.sub = sub
        self.id = sub.req.id
        self.created = int(time.time())
        self.reuse = started.reuse
        self.prompts = prompts
        self.n_choices = len(prompts) * gen.n
        self.prompt: Prompt | None = plan.prompt if plan is not None else None
        self.media = plan.media if plan is not None else ()
        self.parsers = [plan.parser(host) for _ in range(self.n_choices)] if plan is not None else None
        self.echoes = [""] * self.n_choices  # what `echo` puts before each choice's text
        self.headers = explain.header(self.reuse, len(prompts[0]), self.prompt)
        self.built_s = built_s  # how long its prompt took to build (or tokenize), its wait for the pool included

    def explanation(self) -> dict:
        """The cache explanation (the opt-in `warmslot.cache` body field)."""
        return explain.explanation(self.reuse, len(self.prompts[0]), self.prompt)

    def abort(self) -> None:
        """End every choice still running (idempotent)."""
        self.sub.abort()

    def stop_watching(self) -> None:
        """Leave the client to a streaming response, which watches for disconnects itself
        (two readers of the ASGI channel could take each other's disconnect)."""
        self.sub.stop_watching()

    # -- the stream -----------------------------------------------------------------------

    async def events(self) -> AsyncIterator[StreamEvent]:
        """Each choice's deltas and its end, then the request's end. An engine error raises
        its ApiError; the adapter's stream turns it into the API's terminal event."""
        n = self.n_choices
        pending: list[list] = [[] for _ in range(n)]  # logprobs of text a parser still holds back
        generated: list[list[int]] = [[] for _ in range(n)]
        has_calls = [False] * n
        usages = [None] * n
        reasoning: list[str] = []
        live = [_Live(len(self.prompts[i // self.gen.n])) for i in range(n)]
        async for i, ev in self.sub.events():
            live[i].add(ev)
            generated[i] += ev.tokens
            if ev.progress is not None:
                yield live[i].progress(i, ev.progress, self.gen.timings_per_token)
            pending[i] += ev.logprobs
            timings = live[i].usage() if self.gen.timings_per_token else None
            for out in self._outputs(i, ev):
                has_calls[i] |= isinstance(out, ToolCallDelta)
                if isinstance(out, ReasoningDelta):
                    reasoning.append(out.text)
                yield Delta(i, out, pending[i], timings)
                pending[i] = []
            if ev.finish is not None:
                usages[i] = ev.usage
                finish = finish_of(ev.finish, has_calls[i], self._cut(i))
                truncated = ev.finish is FinishReason.LENGTH
                yield ChoiceEnd(i, finish, ev.usage, pending[i], truncated, self._cut_call(i), ev.stop_sequence, generated[i])
                pending[i] = []
        usage = total_usage(usages, self.gen.n)
        self._log(usage)
        yield End(usage, await self.count_tokens("".join(reasoning)))

    def _outputs(self, i: int, ev: Event) -> list:
        if self.parsers is None:  # a text completion: its raw text
            return [ContentDelta(ev.text)] if ev.text or ev.logprobs else []
        return parse_event(self.parsers[i], ev)

    def _cut(self, i: int) -> bool:
        return self.parsers is not None and self.parsers[i].cut

    def _cut_call(self, i: int) -> int | None:
        """The number of the tool call the end of output cut (never sent, never returned)."""
        return self.parsers[i].cut_index if self.parsers is not None else None

    # -- the whole reply --------------------------------------------------------------------

    async def collect(self, request: Request) -> Reply:
        """Every choice's whole reply; a client that leaves aborts them (ClientClosed)."""
        n = self.n_choices
        texts: list[list[str]] = [[] for _ in range(n)]
        logprobs: list[list] = [[] for _ in range(n)]
        tokens: list[list[int]] = [[] for _ in range(n)]
        ends: list[Event | None] = [None] * n
        try:
            async for i, ev in self.sub.events(request.receive):
                texts[i].append(ev.text)
                logprobs[i] += ev.logprobs
                tokens[i] += ev.tokens
                if ev.finish is not None:
                    ends[i] = ev
        except ClientClosed:
            self.log_gone()
            raise
        choices = []
        for i in range(n):
            text, end = "".join(texts[i]), ends[i]
            parsed = parse_reply(self.parsers[i], text, end.finish) if self.parsers is not None else None
            finish = finish_of(end.finish, bool(parsed and parsed.tool_calls), self._cut(i))
            truncated = end.finish is FinishReason.LENGTH
            choices.append(ChoiceReply(
                i, text, parsed, logprobs[i], finish, end.usage, truncated, self._cut_call(i), end.stop_sequence, tokens[i],
            ))
        usage = total_usage([c.usage for c in choices], self.gen.n)
        self._log(usage)
        reasoning = "".join(c.parsed.reasoning_content or "" for c in choices if c.parsed is not None)
        return Reply(choices, usage, await self.count_tokens(reasoning))

    # -- shared pieces ------------------------------------------------------------------------

    async def count_tokens(self, text: str) -> int:
        if not text:
            return 0
        return len(await self.host.server.offload(self.host.builder.tokenizer.raw, text))

    def _log(self, usage) -> None:
        log.info("%s", explain.log_line(self.endpoint, self.reuse, usage, self.prompt, self.built_s))
        req = self.sub.req
        self.host.server.recent.add(summarize(req.id, req.origin, req.tenant, self.reuse, usage, self.prompt, self.media))

    def log_gone(self) -> None:
        slot = f"slot {self.reuse.slot} " if self.reuse is not None else ""
        log.info("%s%s: the client disconnected; the request was aborted", slot, self.endpoint)


class _Live:
    """One choice's usage while it streams (for return_progress and timings_per_token)."""

    def __init__(self, n_prompt: int) -> None:
        self.n_prompt = n_prompt
        self.cached = 0
        self.source = Source.NONE
        self.started = self.first = 0.0  # when it got its slot, when its first token came
        self.n_generated = 0

    def add(self, ev: Event) -> None:
        now = time.monotonic()
        if ev.reuse is not None:
            self.cached, self.source, self.started = ev.reuse.cached, ev.reuse.source, ev.admitted_at or now
        if ev.tokens and not self.first:
            self.first = now
        self.n_generated += len(ev.tokens)

    def progress(self, index: int, progress: Progress, with_timings: bool) -> PromptProgress:
        timings = None
        if with_timings:  # the evaluated prompt tokens so far, nothing generated yet
            timings = Usage(progress.processed, self.cached, source=self.source, prefill_s=progress.elapsed_s)
        return PromptProgress(index, self.n_prompt, self.cached, progress.processed, int(progress.elapsed_s * 1000), timings)

    def usage(self) -> Usage:
        now = time.monotonic()
        first = self.first or now
        return Usage(
            self.n_prompt, self.cached, self.n_generated, self.source, prefill_s=first - self.started, decode_s=now - first,
            ttft_s=first - self.started,
        )


# -- starting a request -------------------------------------------------------------------------


async def start_chat(
    request: Request, host: ModelHost, key: str, params: ChatParams, *, budget: int, endpoint: str, prompt_param: str = "messages"
) -> Generation:
    """Plan a chat-shaped request, submit its choices and wait for admission."""
    check_n(host, params.gen.n)
    deadline = host.server.deadline(params.gen.timeout)  # from arrival: waiting for the pool counts too
    started = time.monotonic()
    async with _waiting(endpoint):
        try:
            plan = await host.server.offload(plan_chat, host, params, budget, request=request, deadline=deadline)
        except ContextOverflow as exc:  # the builder stopped early: named as this API names its prompt
            exc.param = prompt_param
            raise
    built_s = time.monotonic() - started
    params.gen.sampling.reasoning_budget = plan.budget
    sub = _submit(host, key, [plan.prompt.tokens], params.gen, plan, prompt_param, deadline, request.url.path)
    return Generation(host, endpoint, params.gen, sub, await _started(sub, request, endpoint), [plan.prompt.tokens], plan, built_s)


async def start_text(request: Request, host: ModelHost, key: str, params: CompletionParams,
                     endpoint: str = "completion") -> Generation:
    """Tokenize a completion request's prompts, submit their choices, wait for admission.
    `endpoint` names the request in the log ("completion", "infill")."""
    check_n(host, params.gen.n)
    deadline = host.server.deadline(params.gen.timeout)
    many = len(params.prompts) > 1
    started = time.monotonic()
    async with _waiting(endpoint):
        prompts = [
            await host.server.offload(completion_tokens, host, p, f"prompt[{i}]" if many else "prompt", request=request, deadline=deadline)
            for i, p in enumerate(params.prompts)
        ]
        echoes = [
            await host.server.offload(echo_text, host, p, t, request=request, deadline=deadline) for p, t in zip(params.prompts, prompts)
        ] if params.gen.echo else None
    built_s = time.monotonic() - started
    sub = _submit(host, key, prompts, params.gen, None, "prompt", deadline, request.url.path)
    generation = Generation(host, endpoint, params.gen, sub, await _started(sub, request, endpoint), prompts, None, built_s)
    if echoes is not None:
        generation.echoes = [echoes[i // params.gen.n] for i in range(generation.n_choices)]
    return generation


@contextlib.asynccontextmanager
async def _waiting(endpoint: str):
    """Before admission: a client that leaves is logged (its work was dropped)."""
    try:
        yield
    except ClientClosed:
        log.info("%s: the client disconnected while the request waited; it was aborted", endpoint)
        raise


def _submit(
    host: ModelHost, key: str, prompts: list[list[int]], gen: GenerationParams, plan: ChatPlan | None, prompt_param: str,
    deadline: float | None, origin: str,
) -> Submission:
    """One engine request per choice. Choice i*n + j answers prompt i with its j-th sample:
    the first evaluates the prompt, the other n-1 are its siblings, which the engine forks
    from it instead of computing the prompt again."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    grammar, boundaries = (plan.grammar, plan.boundaries) if plan is not None else (None, ())
    media = plan.media if plan is not None else ()
    reqs: list[GenerateRequest] = []
    adapters = host.adapters_of(gen.lora)
    for p, tokens in enumerate(prompts):
        first = None
        for j in range(gen.n):
            sink = TaggedSink(loop, queue, p * gen.n + j, quiet=not gen.stream)
            req = _engine_request(
                host, tokens, gen, key, grammar, boundaries, sink, choice=j, sibling_of=first, deadline=deadline, media=media,
                origin=origin, adapters=adapters,
            )
            first = first or req.id
            reqs.append(req)
    limit = host.server.time_limit(gen.timeout)
    return Submission.submit(host.engine, reqs, queue, host.engine.info.n_ctx_slot, prompt_param, limit)


def _engine_request(
    host: ModelHost, tokens: list[int], gen: GenerationParams, key: str, grammar, boundaries, sink, *, choice: int, sibling_of,
    deadline: float | None, media=(), origin: str = "", adapters: AdapterSet = NO_ADAPTERS,
) -> GenerateRequest:
    """The engine request for one choice (`choice` > 0: another choice of the same prompt,
    sampled with seed + choice when a seed is given)."""
    sampling = gen.sampling
    if grammar is not None:
        sampling.grammar = grammar
    if choice:
        seed = None if sampling.seed is None else sampling.seed + choice
        sampling = dataclasses.replace(sampling, seed=seed)
    n_predict = host.config.n_predict
    return GenerateRequest(
        id=secrets.token_hex(12),
        tokens=tokens,
        sink=sink,
        sampling=sampling,
        # the engine stops at the slot's context; None: nothing else stops it
        max_tokens=gen.max_tokens if gen.max_tokens is not None else (n_predict if n_predict >= 0 else None),
        stop=gen.stop,
        ignore_eos=gen.ignore_eos,
        tenant=host.server.tenant(key, gen.tenant_hint),
        reuse_prefix=gen.cache_prompt,
        cache_key=gen.cache_key,
        session=gen.session,
        keep_s=gen.keep_s,
        boundaries=tuple(boundaries),
        logprobs=gen.logprobs,
        sibling_of=sibling_of,
        deadline=deadline,
        media=tuple(media),
        return_progress=gen.return_progress,
        origin=origin,
        n_indent=gen.n_indent,
        t_max_predict_ms=gen.t_max_predict_ms,
        adapters=adapters,
    )


async def _started(sub: Submission, request: Request, endpoint: str) -> Event:
    async with _waiting(endpoint):
        return await sub.started(request.receive)
