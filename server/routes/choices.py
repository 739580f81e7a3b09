"""Several choices in one response: `n` > 1 for chat and completions, and batches of prompts.

Choice i*n + j answers prompt i with its j-th sample. The first choice of a prompt evaluates
it; the other n-1 are submitted as its siblings, so the engine forks the evaluated prompt
into their slots instead of computing it again. Siblings need free slots like any request:
with fewer idle slots than choices, the rest wait and start as slots free up (still
reusing the prompt). Each choice samples independently (seed + j when a seed is given).
Usage counts each prompt once and sums the completions.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
from dataclasses import dataclass, field

from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from warmslot.slots import Usage

from .. import explain, responses
from ..bridge import ClientGone
from ..errors import ApiError
from ..fanout import Fanout, TaggedSink
from ..logprobs import CompletionLogprobs, chat_content, chat_logprobs
from ..output.events import ReasoningDelta, ToolCallDelta
from ..protocol import ChatParams, CompletionParams, GenerationParams
from ..state import Warmslot
from .generation import (
    ChatPlan, Gone, _checkpoint_boundaries, _count_tokens, _finish_reason, _log_request, completion_tokens, echo_text,
    output_parser,
)
from ..output.reply import parse_event, parse_reply


@dataclass(slots=True)
class Choice:
    """What one choice has produced so far."""

    text: list[str] = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    usage: Usage | None = None
    finish: object = None


def _submit(server: Warmslot, prompts: list[list[int]], gen: GenerationParams, key: str, grammar=None, boundaries=()) -> Fanout:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    reqs = []
    for p, tokens in enumerate(prompts):
        first = None
        for j in range(gen.n):
            sink = TaggedSink(loop, queue, p * gen.n + j)
            req = server.make_request(tokens, gen, key, grammar, boundaries, sink, choice=j, sibling_of=first)
            first = first or req.id
            reqs.append(req)
    return Fanout.submit(server.engine, reqs, queue, server.engine.info.n_ctx_slot)


async def _started(fan: Fanout, request: Request):
    try:
        return await fan.started(request.receive)
    except ClientGone:
        raise Gone() from None


def total_usage(usages: list[Usage], n: int) -> Usage:
    """Each prompt once (its first choice's), the completions summed."""
    firsts = usages[::n]
    cached = sum(u.cached_tokens for u in firsts)
    source = next((u.source for u in firsts if u.cached_tokens), firsts[0].source)
    return dataclasses.replace(
        firsts[0], prompt_tokens=sum(u.prompt_tokens for u in firsts), cached_tokens=cached, source=source,
        completion_tokens=sum(u.completion_tokens for u in usages),
    )


async def _collect(fan: Fanout, request: Request, n_choices: int) -> list[Choice]:
    choices = [Choice() for _ in range(n_choices)]
    try:
        async for index, ev in fan.events(request.receive):
            choice = choices[index]
            choice.text.append(ev.text)
            choice.logprobs += ev.logprobs
            if ev.finish is not None:
                choice.usage, choice.finish = ev.usage, ev.finish
    except ClientGone:
        raise Gone() from None
    return choices


# -- chat --------------------------------------------------------------------------------


async def chat_choices(request: Request, server: Warmslot, key: str, params: ChatParams, plan: ChatPlan) -> Response:
    gen, prompt = params.gen, plan.prompt
    fan = _submit(server, [prompt.tokens], gen, key, plan.grammar, _checkpoint_boundaries(prompt))
    started = await _started(fan, request)
    env = server.envelope("chatcmpl", fan)
    headers = explain.header(started.reuse, len(prompt.tokens), prompt)
    done = functools.partial(_log_request, "chat", started.reuse, prompt)
    parsers = [output_parser(server, plan) for _ in range(gen.n)]
    if gen.stream:
        fan.stop_watching()
        return EventSourceResponse(_chat_stream(server, fan, env, parsers, gen, done), headers=headers, ping=15)
    choices = await _collect(fan, request, gen.n)
    bodies, reasoning = [], 0
    for i, (choice, parser) in enumerate(zip(choices, parsers)):
        parsed = parse_reply(parser, "".join(choice.text), choice.finish)
        message = responses.chat_message(parsed.content, parsed.reasoning_content, parsed.tool_calls)
        reasoning += await _count_tokens(server, parsed.reasoning_content)
        lp = chat_logprobs(server.engine.vocab, choice.logprobs if gen.logprobs is not None else None)
        bodies.append(responses.chat_choice(message, _finish_reason(choice.finish, bool(parsed.tool_calls), parser.cut), i, lp))
    usage = total_usage([c.usage for c in choices], gen.n)
    done(usage)
    body = responses.chat_response(env, {}, "", usage, reasoning, choices=bodies)
    if gen.explain_cache:
        body["warmslot"] = {"cache": explain.explanation(started.reuse, len(prompt.tokens), prompt)}
    return JSONResponse(body, headers=headers)


async def _chat_stream(server: Warmslot, fan: Fanout, env, parsers, gen: GenerationParams, done):
    vocab = server.engine.vocab
    try:
        for i in range(len(parsers)):
            yield responses.chat_chunk(env, {"role": "assistant", "content": ""}, index=i)
        has_calls = [False] * len(parsers)
        pending: list[list] = [[] for _ in parsers]  # logprobs of text a parser still holds back
        reasoning: list[str] = []
        usages: list[Usage | None] = [None] * len(parsers)
        async for i, ev in fan.events():
            parser = parsers[i]
            outputs = parse_event(parser, ev)
            pending[i] += ev.logprobs
            for out in outputs:
                has_calls[i] |= isinstance(out, ToolCallDelta)
                if isinstance(out, ReasoningDelta):
                    reasoning.append(out.text)
                lp = {"content": chat_content(vocab, pending[i])} if gen.logprobs is not None else None
                pending[i] = []
                yield responses.chat_chunk(env, responses.delta_body(out), index=i, logprobs=lp)
            if ev.finish is not None:
                usages[i] = ev.usage
                lp = {"content": chat_content(vocab, pending[i])} if pending[i] else None
                yield responses.chat_chunk(env, {}, _finish_reason(ev.finish, has_calls[i], parser.cut), ev.usage, index=i, logprobs=lp)
        usage = total_usage(usages, gen.n)
        done(usage)
        if gen.include_usage:
            yield responses.usage_chunk(env, usage, reasoning_tokens=await _count_tokens(server, "".join(reasoning)))
        yield "[DONE]"
    except ApiError as exc:
        yield json.dumps(exc.body())
        yield "[DONE]"


# -- completions -----------------------------------------------------------------------------


async def completion_choices(request: Request, server: Warmslot, key: str, params: CompletionParams) -> Response:
    gen = params.gen
    prompts = [await completion_tokens(server, p, f"prompt[{i}]") for i, p in enumerate(params.prompts)]
    echoes = [await echo_text(server, p, t) if gen.echo else "" for p, t in zip(params.prompts, prompts)]
    fan = _submit(server, prompts, gen, key)
    started = await _started(fan, request)
    env = server.envelope("cmpl", fan)
    headers = explain.header(started.reuse, len(prompts[0]), None)
    done = functools.partial(_log_request, "completion", started.reuse, None)
    n_choices = len(prompts) * gen.n
    echo_of = [echoes[i // gen.n] for i in range(n_choices)]
    if gen.stream:
        fan.stop_watching()
        return EventSourceResponse(_completion_stream(server, fan, env, gen, echo_of, done), headers=headers, ping=15)
    choices = await _collect(fan, request, n_choices)
    bodies = []
    for i, choice in enumerate(choices):
        lp = CompletionLogprobs(server.engine.vocab, len(echo_of[i])).add(choice.logprobs) if gen.logprobs is not None else None
        bodies.append(responses.completion_choice(echo_of[i] + "".join(choice.text), _finish_reason(choice.finish, False), i, lp))
    usage = total_usage([c.usage for c in choices], gen.n)
    done(usage)
    return JSONResponse(responses.completion_response(env, "", "", usage, choices=bodies), headers=headers)


async def _completion_stream(server: Warmslot, fan: Fanout, env, gen: GenerationParams, echo_of: list[str], done):
    vocab = server.engine.vocab
    try:
        logprobs = [CompletionLogprobs(vocab, len(e)) if gen.logprobs is not None else None for e in echo_of]
        for i, echo in enumerate(echo_of):
            if echo:
                yield responses.completion_chunk(env, echo, index=i)
        usages: list[Usage | None] = [None] * len(echo_of)
        async for i, ev in fan.events():
            if ev.text or ev.logprobs:
                lp = logprobs[i].add(ev.logprobs) if logprobs[i] is not None else None
                yield responses.completion_chunk(env, ev.text, index=i, logprobs=lp)
            if ev.finish is not None:
                usages[i] = ev.usage
                yield responses.completion_chunk(env, "", _finish_reason(ev.finish, False), ev.usage, index=i)
        usage = total_usage(usages, gen.n)
        done(usage)
        if gen.include_usage:
            yield responses.usage_chunk(env, usage, "text_completion")
        yield "[DONE]"
    except ApiError as exc:
        yield json.dumps(exc.body())
        yield "[DONE]"
