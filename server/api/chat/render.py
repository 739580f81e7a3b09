"""Chat completion bodies and stream chunks from the pipeline's reply and events."""

from __future__ import annotations

import json
from typing import Any

from warmslot.slots import Usage, Vocab

from ...errors import ApiError
from ...output.logprob_shapes import chat_content, chat_logprobs
from ...output.parsed import ContentDelta, ReasoningDelta, ToolCall, ToolCallDelta
from ...pipeline import ChoiceEnd, Delta, End, PromptProgress, Reply, StreamEvent
from ...request.protocol import GenerationParams
from ..bodies import Envelope, error_events, progress_fields, timings_body, usage_body, usage_chunk

CHUNK = "chat.completion.chunk"


def tool_call_body(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def chat_message(content: str | None, reasoning: str | None, tool_calls: list[ToolCall]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content if content or not tool_calls else None}
    if content is None and not tool_calls:
        message["content"] = ""
    if reasoning:
        message["reasoning_content"] = reasoning
    if tool_calls:
        message["tool_calls"] = [tool_call_body(c) for c in tool_calls]
    return message


def _cut_field(cut_call: int | None) -> dict[str, Any]:
    """warmslot's extension on a choice that max_tokens cut inside a tool call: which call
    never closed (it is not among the calls; a stream may have sent its first fragments)."""
    return {"warmslot": {"incomplete_tool_call": cut_call}} if cut_call is not None else {}


def chat_body(env: Envelope, reply: Reply, vocab: Vocab, with_logprobs: bool) -> dict[str, Any]:
    choices = []
    for c in reply.choices:
        parsed = c.parsed
        message = chat_message(parsed.content, parsed.reasoning_content, parsed.tool_calls)
        logprobs = chat_logprobs(vocab, c.logprobs if with_logprobs else None)
        choices.append({"index": c.index, "message": message, "logprobs": logprobs, "finish_reason": c.finish.value, **_cut_field(c.cut_call)})
    body = env.base("chat.completion")
    body["choices"] = choices
    body["usage"] = usage_body(reply.usage, reply.reasoning_tokens)
    body["timings"] = timings_body(reply.usage)
    return body


def chat_chunk(
    env: Envelope, delta: dict, finish_reason: str | None = None, usage: Usage | None = None,
    *, index: int = 0, logprobs: dict | None = None, extra: dict | None = None,
) -> str:
    # one chunk per streamed delta: assembled from a cached head rather than a dict per token
    choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason, **(extra or {})}
    tail = f', "timings": {json.dumps(timings_body(usage))}' if usage is not None else ""
    return f'{env.head(CHUNK)}, "choices": [{json.dumps(choice, ensure_ascii=False)}]{tail}}}'


def delta_body(event) -> dict[str, Any]:
    """A parser event as an OpenAI chat delta."""
    if isinstance(event, ContentDelta):
        return {"content": event.text}
    if isinstance(event, ReasoningDelta):
        return {"reasoning_content": event.text}
    assert isinstance(event, ToolCallDelta)
    call: dict[str, Any] = {"index": event.index, "function": {"arguments": event.arguments}}
    if event.id is not None:
        call["id"] = event.id
        call["type"] = "function"
    if event.name is not None:
        call["function"]["name"] = event.name
    return {"tool_calls": [call]}


class ChatStream:
    """A chat completion stream: a role chunk per choice, deltas, a finish chunk per choice,
    the usage chunk when asked for, then [DONE]."""

    def __init__(self, env: Envelope, vocab: Vocab, gen: GenerationParams, n_choices: int) -> None:
        self.env = env
        self.vocab = vocab
        self.gen = gen
        self.n_choices = n_choices

    def start(self) -> list[str]:
        return [chat_chunk(self.env, {"role": "assistant", "content": None}, index=i) for i in range(self.n_choices)]  # as llama-server opens

    def render(self, event: StreamEvent) -> list[str]:
        if isinstance(event, Delta):
            lp = {"content": chat_content(self.vocab, event.logprobs)} if self.gen.logprobs is not None else None
            return [chat_chunk(self.env, delta_body(event.out), usage=event.timings, index=event.index, logprobs=lp)]
        if isinstance(event, PromptProgress):  # as llama-server: an opening delta with the progress
            choice = {"index": event.index, "delta": {"role": "assistant", "content": None}, "logprobs": None, "finish_reason": None}
            return [json.dumps({**self.env.base(CHUNK), "choices": [choice], **progress_fields(event)}, ensure_ascii=False)]
        if isinstance(event, ChoiceEnd):
            lp = {"content": chat_content(self.vocab, event.logprobs)} if event.logprobs else None
            extra = _cut_field(event.cut_call)
            return [chat_chunk(self.env, {}, event.finish.value, event.usage, index=event.index, logprobs=lp, extra=extra)]
        assert isinstance(event, End)
        usage = [usage_chunk(self.env, event.usage, CHUNK, event.reasoning_tokens)] if self.gen.include_usage else []
        return usage + ["[DONE]"]

    def fail(self, error: ApiError) -> list[str]:
        return error_events(error)
