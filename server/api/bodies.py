"""OpenAI response bodies: chat completions, text completions, chunks and usage."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from warmslot.slots import Usage

from .output.events import ContentDelta, ReasoningDelta, ToolCall, ToolCallDelta


@dataclass(slots=True)
class Envelope:
    """What every body of one response repeats."""

    id: str
    created: int
    model: str
    fingerprint: str
    _heads: dict[str, str] = field(default_factory=dict)

    def base(self, obj: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
        }

    def head(self, obj: str) -> str:
        """The JSON text of `base(obj)` without its closing brace (for fast chunks)."""
        text = self._heads.get(obj)
        if text is None:
            text = self._heads[obj] = json.dumps(self.base(obj), ensure_ascii=False)[:-1]
        return text


def usage_body(usage: Usage, reasoning_tokens: int = 0) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
    }


def timings_body(usage: Usage) -> dict[str, Any]:
    """llama-server's `timings` object, so tools written for it read warmslot's numbers too."""
    computed = usage.prompt_tokens - usage.cached_tokens
    return {
        "cache_n": usage.cached_tokens,
        "prompt_n": computed,
        "prompt_ms": round(usage.prefill_s * 1000, 3),
        "prompt_per_second": computed / usage.prefill_s if usage.prefill_s > 0 else 0.0,
        "predicted_n": usage.completion_tokens,
        "predicted_ms": round(usage.decode_s * 1000, 3),
        "predicted_per_second": usage.completion_tokens / usage.decode_s if usage.decode_s > 0 else 0.0,
    }


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


def chat_choice(message: dict, finish_reason: str, index: int = 0, logprobs: dict | None = None) -> dict[str, Any]:
    return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}


def chat_response(
    env: Envelope, message: dict, finish_reason: str, usage: Usage, reasoning_tokens: int = 0,
    *, logprobs: dict | None = None, choices: list[dict] | None = None,
) -> dict[str, Any]:
    """A chat completion: one choice (`message`), or `choices` made with `chat_choice`."""
    body = env.base("chat.completion")
    body["choices"] = choices if choices is not None else [chat_choice(message, finish_reason, 0, logprobs)]
    body["usage"] = usage_body(usage, reasoning_tokens)
    body["timings"] = timings_body(usage)
    return body


def chat_chunk(
    env: Envelope, delta: dict, finish_reason: str | None = None, usage: Usage | None = None,
    *, index: int = 0, logprobs: dict | None = None,
) -> str:
    # one chunk per streamed delta: assembled from a cached head rather than a dict per token
    choice = json.dumps({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}, ensure_ascii=False)
    tail = f', "timings": {json.dumps(timings_body(usage))}' if usage is not None else ""
    return f'{env.head("chat.completion.chunk")}, "choices": [{choice}]{tail}}}'


def usage_chunk(env: Envelope, usage: Usage, obj: str = "chat.completion.chunk", reasoning_tokens: int = 0) -> str:
    body = env.base(obj)
    body["choices"] = []
    body["usage"] = usage_body(usage, reasoning_tokens)
    return json.dumps(body, ensure_ascii=False)


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


def completion_choice(text: str, finish_reason: str | None, index: int = 0, logprobs: dict | None = None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


def completion_response(
    env: Envelope, text: str, finish_reason: str, usage: Usage, *, logprobs: dict | None = None, choices: list[dict] | None = None
) -> dict[str, Any]:
    """A text completion: one choice (`text`), or `choices` made with `completion_choice`."""
    body = env.base("text_completion")
    body["choices"] = choices if choices is not None else [completion_choice(text, finish_reason, 0, logprobs)]
    body["usage"] = usage_body(usage)
    body["timings"] = timings_body(usage)
    return body


def completion_chunk(
    env: Envelope, text: str, finish_reason: str | None = None, usage: Usage | None = None,
    *, index: int = 0, logprobs: dict | None = None,
) -> str:
    body = env.base("text_completion")
    body["choices"] = [completion_choice(text, finish_reason, index, logprobs)]
    if usage is not None:
        body["timings"] = timings_body(usage)
    return json.dumps(body, ensure_ascii=False)
