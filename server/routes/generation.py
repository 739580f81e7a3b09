"""Generation routes: /v1/chat/completions and /v1/completions, plain and streamed.

Handlers parse and validate, build the prompt off the event loop, submit token ids to the
engine and turn its events into OpenAI bodies or SSE chunks. Once an SSE stream has sent its
first byte the status cannot change, so a later error goes inside the stream, which still
ends with [DONE].
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass

from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from warmslot.slots import Event, FinishReason, GrammarSpec
from warmslot.slots.reasoning_budget import ReasoningBudget

from .. import explain, responses
from ..logprobs import CompletionLogprobs, chat_content, chat_logprobs
from ..bridge import ClientGone, Submission
from ..chat import Prompt, prompt_opens_reasoning
from ..errors import ApiError, InvalidRequest, ServerError
from ..gbnf.response_format import json_schema_grammar
from ..gbnf.tools import tool_call_grammar
from ..output.events import ReasoningDelta, ToolCallDelta
from ..output.parser import OutputParser
from ..output.reply import parse_event, parse_reply
from ..protocol import ChatParams, GenerationParams, ToolChoice, parse_chat, parse_completion, parse_response_format, validate_tool_choice, validate_tools
from ..reasoning import budget_spec, request_budget
from ..state import Warmslot, open_request

log = logging.getLogger("warmslot.server")


def _finish_reason(reason: FinishReason | None, has_tool_calls: bool, cut: bool = False) -> str:
    """"length" when max_tokens cut the reply, also inside a tool call (`cut`): a client must
    not run a call that never closed. Calls that all closed before the cut are "tool_calls"."""
    if reason is FinishReason.LENGTH and (cut or not has_tool_calls):
        return "length"
    return "tool_calls" if has_tool_calls else "stop"


async def chat_completions(request: Request) -> Response:
    server, key, body = await open_request(request)
    params = parse_chat(body, server.engine.info.n_vocab, server.config.sampling)
    check_n(server, params.gen.n)
    budget = request_budget(body, server.config.reasoning_budget)
    plan = await server.offload(_plan_chat, server, params, budget)
    if params.gen.n > 1:
        from .choices import chat_choices

        return await chat_choices(request, server, key, params, plan)
    prompt = plan.prompt
    params.gen.sampling.reasoning_budget = plan.budget
    sub = server.submit(prompt.tokens, params.gen, key, plan.grammar, _checkpoint_boundaries(prompt))
    started = await _started(sub, request)
    parser = output_parser(server, plan)
    env = server.envelope("chatcmpl", sub)
    n_prompt = len(prompt.tokens)
    headers = explain.header(started.reuse, n_prompt, prompt)
    done = functools.partial(_log_request, "chat", started.reuse, prompt)
    if params.gen.stream:
        sub.stop_watching()
        return EventSourceResponse(_chat_stream(server, sub, env, parser, params.gen, done), headers=headers, ping=15)
    logprobs = [] if params.gen.logprobs is not None else None
    result_text, usage, finish = await _collect(sub, request, logprobs)
    done(usage)
    parsed = parse_reply(parser, result_text, finish)
    message = responses.chat_message(parsed.content, parsed.reasoning_content, parsed.tool_calls)
    reasoning_tokens = await _count_tokens(server, parsed.reasoning_content)
    reason = _finish_reason(finish, bool(parsed.tool_calls), parser.cut)
    body = responses.chat_response(env, message, reason, usage, reasoning_tokens, logprobs=chat_logprobs(server.engine.vocab, logprobs))
    if params.gen.explain_cache:
        body["warmslot"] = {"cache": explain.explanation(started.reuse, n_prompt, prompt)}
    return JSONResponse(body, headers=headers)


async def completions(request: Request) -> Response:
    server, key, body = await open_request(request)
    params = parse_completion(body, server.engine.info.n_vocab, server.config.sampling)
    check_n(server, params.gen.n)
    if params.gen.n > 1 or len(params.prompts) > 1:
        from .choices import completion_choices

        return await completion_choices(request, server, key, params)
    tokens = await completion_tokens(server, params.prompt, "prompt")
    echo = await echo_text(server, params.prompt, tokens) if params.gen.echo else ""
    sub = server.submit(tokens, params.gen, key)
    started = await _started(sub, request)
    env = server.envelope("cmpl", sub)
    headers = explain.header(started.reuse, len(tokens), None)
    done = functools.partial(_log_request, "completion", started.reuse, None)
    if params.gen.stream:
        sub.stop_watching()
        logprobs = CompletionLogprobs(server.engine.vocab, len(echo)) if params.gen.logprobs is not None else None
        return EventSourceResponse(_completion_stream(sub, env, params.gen, done, echo, logprobs), headers=headers, ping=15)
    entries = [] if params.gen.logprobs is not None else None
    text, usage, finish = await _collect(sub, request, entries)
    done(usage)
    logprobs = CompletionLogprobs(server.engine.vocab, len(echo)).add(entries) if entries is not None else None
    body = responses.completion_response(env, echo + text, _finish_reason(finish, False), usage, logprobs=logprobs)
    if params.gen.explain_cache:
        body["warmslot"] = {"cache": explain.explanation(started.reuse, len(tokens), None)}
    return JSONResponse(body, headers=headers)


def check_n(server: Warmslot, n: int) -> None:
    if n > server.config.max_n:
        raise InvalidRequest(f"'n' must be at most {server.config.max_n} (--max-n)", param="n")


async def completion_tokens(server: Warmslot, prompt: str | list[int], param: str) -> list[int]:
    """A completion prompt's tokens (a text is tokenized off the event loop)."""
    if isinstance(prompt, str):
        tokens = await server.offload(server.builder.tokenizer.prompt, prompt)
    else:
        tokens = list(prompt)
    if not tokens:
        raise InvalidRequest("the prompt has no tokens", param=param)
    return tokens


async def echo_text(server: Warmslot, prompt: str | list[int], tokens: list[int]) -> str:
    """What `echo` puts before a choice's text: the prompt as sent, or its tokens' text."""
    if isinstance(prompt, str):
        return prompt
    return await server.offload(server.engine.vocab.detokenize, tokens)


def output_parser(server: Warmslot, plan: "ChatPlan") -> OutputParser:
    return OutputParser(
        format=server.tool_format,
        reasoning=server.reasoning[0],
        starts_in_reasoning=plan.opens_reasoning,
        tools_enabled=plan.tools is not None,
        tools=plan.tools,
    )


@dataclass(slots=True)
class ChatPlan:
    """What a chat request needs before it is submitted."""

    prompt: Prompt
    tools: list[dict] | None  # the tools offered to the model (None: no tool calls)
    opens_reasoning: bool  # the prompt leaves a think block open
    grammar: GrammarSpec | None
    budget: ReasoningBudget | None = None  # --reasoning-budget


def _plan_chat(server: Warmslot, params: ChatParams, budget: int = -1) -> ChatPlan:
    """Validate the tools, build the prompt and the grammar. Runs on the tokenize pool: schema
    conversion, template rendering and grammar checks can take a while."""
    tools = validate_tools(params.tools) if params.tools is not None else []
    choice = validate_tool_choice(params.tool_choice, tools)
    offered = tools if tools and choice.mode != "none" else None
    # NOTE: tool_choice "none" still renders the tools (only the grammar and the parsing turn
    # off), as llama-server and vLLM do: the prompt, and so the cached prefix, stays the same
    prompt = server.builder.build(params.messages, tools or None, extra=params.template_kwargs)
    reasoning = server.reasoning[0]
    opens = reasoning and prompt_opens_reasoning(prompt.text)
    grammar = _grammar(server, params, offered, choice, reasoning, opens)
    spec = budget_spec(budget, server.engine.vocab, prompt_opens_reasoning(prompt.text)) if server.thinks else None
    return ChatPlan(prompt, offered, opens, grammar, spec)


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
    """Where agent histories diverge: the end of the system text itself (a turn that drops
    the tools, such as a summary turn, still reuses the system prompt), the end of the
    system+tools prefix (the content start of the first non-system message), the start of
    every user or tool message, and the start of the generation prompt (templates often
    render the previous turn's generation prompt differently once the reply is in the
    history, e.g. adding an empty think block)."""
    out = [prompt.system_end] if prompt.system_end is not None else []
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
        raise Gone() from None


class Gone(Exception):
    """The client left before the response started; nothing to send."""


async def _collect(sub: Submission, request: Request, logprobs: list | None = None):
    """The text, usage and finish of a request (its logprobs appended to `logprobs`)."""
    text, usage, finish = [], None, None
    try:
        async for ev in sub.events(request.receive):
            text.append(ev.text)
            if logprobs is not None:
                logprobs.extend(ev.logprobs)
            if ev.finish is not None:
                usage, finish = ev.usage, ev.finish
    except ClientGone:
        raise Gone() from None
    return "".join(text), usage, finish


def _log_request(endpoint: str, reuse, prompt, usage) -> None:
    if usage is not None:
        log.info("%s", explain.log_line(endpoint, reuse, usage, prompt))


async def _count_tokens(server: Warmslot, text: str | None) -> int:
    if not text:
        return 0
    tokens = await server.offload(server.builder.tokenizer.raw, text)
    return len(tokens)


async def _chat_stream(server: Warmslot, sub: Submission, env, parser, gen: GenerationParams, done):
    try:
        yield responses.chat_chunk(env, {"role": "assistant", "content": ""})
        has_calls = False
        reasoning: list[str] = []
        pending: list = []  # logprobs of tokens whose text the parser still holds back
        vocab = server.engine.vocab
        async for ev in sub.events():
            outputs = parse_event(parser, ev)
            pending += ev.logprobs
            for out in outputs:
                has_calls |= isinstance(out, ToolCallDelta)
                if isinstance(out, ReasoningDelta):
                    reasoning.append(out.text)
                lp = {"content": chat_content(vocab, pending)} if gen.logprobs is not None else None
                pending = []
                yield responses.chat_chunk(env, responses.delta_body(out), logprobs=lp)
            if ev.finish is not None:
                done(ev.usage)
                lp = {"content": chat_content(vocab, pending)} if pending else None
                yield responses.chat_chunk(env, {}, _finish_reason(ev.finish, has_calls, parser.cut), ev.usage, logprobs=lp)
                if gen.include_usage:
                    n_reasoning = await _count_tokens(server, "".join(reasoning))
                    yield responses.usage_chunk(env, ev.usage, reasoning_tokens=n_reasoning)
        yield "[DONE]"
    except Exception as exc:  # noqa: BLE001 - the stream started: the error goes inside it
        for event in _stream_error(exc):
            yield event


async def _completion_stream(sub: Submission, env, gen: GenerationParams, done, echo: str = "", logprobs=None):
    try:
        if echo:
            yield responses.completion_chunk(env, echo)
        async for ev in sub.events():
            if ev.text or ev.logprobs:
                lp = logprobs.add(ev.logprobs) if logprobs is not None else None
                yield responses.completion_chunk(env, ev.text, logprobs=lp)
            if ev.finish is not None:
                done(ev.usage)
                yield responses.completion_chunk(env, "", _finish_reason(ev.finish, False), ev.usage)
                if gen.include_usage:
                    yield responses.usage_chunk(env, ev.usage, "text_completion")
        yield "[DONE]"
    except Exception as exc:  # noqa: BLE001 - the stream started: the error goes inside it
        for event in _stream_error(exc):
            yield event


def _stream_error(exc: Exception):
    """The events that end a started stream on an error: an OpenAI error body, then [DONE]."""
    if not isinstance(exc, ApiError):
        log.exception("unhandled error in a stream")
        exc = ServerError(f"internal error: {type(exc).__name__}")
    yield json.dumps(exc.body())
    yield "[DONE]"
