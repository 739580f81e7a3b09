"""Messages bodies and the Messages event stream from the pipeline's reply and events.

A stream is `message_start`, a `ping`, then each content block in order
(`content_block_start`, its deltas: `thinking_delta`, `text_delta` or `input_json_delta`,
`content_block_stop`), then `message_delta` with the stop reason and the usage, then
`message_stop`. A failure after the first byte is one `error` event, and the stream ends.

Usage: `cache_read_input_tokens` is the prompt tokens reused from any tier (slot, another
slot, RAM, disk), `input_tokens` the ones computed, so that the two add up to the prompt as
Anthropic's do. Every computed token is cached at no extra cost, so
`cache_creation_input_tokens` is always 0.
"""

from __future__ import annotations

import json
from typing import Any

from warmslot.slots import Usage

from ...errors import ApiError
from ...output.parsed import ContentDelta, ParsedMessage, ReasoningDelta, ToolCallDelta
from ...pipeline import ChoiceEnd, Delta, End, Finish, PromptProgress, Reply, StreamEvent
from .errors import error_body


def stop_reason(finish: Finish, stop_sequence: str | None) -> str:
    if finish is Finish.TOOL_CALLS:
        return "tool_use"
    if finish is Finish.LENGTH:
        return "max_tokens"
    return "stop_sequence" if stop_sequence is not None else "end_turn"


def usage_body(usage: Usage) -> dict[str, int]:
    return {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
    }


def _input(arguments: str) -> dict:
    """A closed tool call's arguments as the `input` object."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def content_blocks(parsed: ParsedMessage) -> list[dict[str, Any]]:
    """A whole answer's blocks: thinking, text, then the tool calls (a text block when
    there is nothing else)."""
    blocks: list[dict[str, Any]] = []
    if parsed.reasoning_content:
        blocks.append({"type": "thinking", "thinking": parsed.reasoning_content, "signature": ""})
    if parsed.content or not parsed.tool_calls:
        blocks.append({"type": "text", "text": parsed.content or ""})
    blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": _input(c.arguments)} for c in parsed.tool_calls]
    return blocks


def message_shell(message_id: str, model: str, content: list, usage: dict, stop: str | None = None, sequence: str | None = None) -> dict:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": sequence,
        "usage": usage,
    }


def message_body(message_id: str, model: str, reply: Reply) -> dict[str, Any]:
    choice = reply.choices[0]
    return message_shell(
        message_id, model, content_blocks(choice.parsed), usage_body(reply.usage),
        stop_reason(choice.finish, choice.stop_sequence), choice.stop_sequence,
    )


def _event(kind: str, **fields: Any) -> dict[str, str]:
    return {"event": kind, "data": json.dumps({"type": kind, **fields}, ensure_ascii=False)}


class MessageStream:
    """The Messages event stream of one reply (a `pipeline.Renderer`)."""

    def __init__(self, message_id: str, model: str, prompt_tokens: int, cached_tokens: int) -> None:
        self.message_id = message_id
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.cached_tokens = cached_tokens
        self._index = -1  # the open block's index (-1: none yet)
        self._open: str | None = None  # its kind: thinking, text or tool_use
        self._call: int | None = None  # the tool call index an open tool_use block streams
        self._stop: tuple[str, str | None] = ("end_turn", None)

    def start(self) -> list[dict]:
        usage = {
            "input_tokens": self.prompt_tokens - self.cached_tokens, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": self.cached_tokens, "output_tokens": 0,
        }
        message = message_shell(self.message_id, self.model, [], usage)
        return [_event("message_start", message=message), _event("ping")]

    def render(self, event: StreamEvent) -> list[dict]:
        if isinstance(event, Delta):
            return self._delta(event.out)
        if isinstance(event, PromptProgress):  # Anthropic's stream has no such event
            return []
        if isinstance(event, ChoiceEnd):
            self._stop = (stop_reason(event.finish, event.stop_sequence), event.stop_sequence)
            empty = self._begin("text", {"type": "text", "text": ""}) if self._index < 0 else []  # as a whole reply has
            return empty + self._close()
        assert isinstance(event, End)
        delta = {"stop_reason": self._stop[0], "stop_sequence": self._stop[1]}
        return [_event("message_delta", delta=delta, usage=usage_body(event.usage)), _event("message_stop")]

    def fail(self, error: ApiError) -> list[dict]:
        return [_event("error", error=error_body(error)["error"])]

    def _delta(self, out) -> list[dict]:
        if isinstance(out, ToolCallDelta):
            events = [] if self._open == "tool_use" and self._call == out.index else self._begin(
                "tool_use", {"type": "tool_use", "id": out.id or f"toolu_{out.index}", "name": out.name or "", "input": {}}
            )
            self._call = out.index
            if out.arguments:
                events.append(self._block_delta({"type": "input_json_delta", "partial_json": out.arguments}))
            return events
        if not out.text:
            return []
        if isinstance(out, ReasoningDelta):
            events = [] if self._open == "thinking" else self._begin("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            return events + [self._block_delta({"type": "thinking_delta", "thinking": out.text})]
        assert isinstance(out, ContentDelta)
        events = [] if self._open == "text" else self._begin("text", {"type": "text", "text": ""})
        return events + [self._block_delta({"type": "text_delta", "text": out.text})]

    def _begin(self, kind: str, block: dict) -> list[dict]:
        events = self._close()
        self._index += 1
        self._open = kind
        return events + [_event("content_block_start", index=self._index, content_block=block)]

    def _block_delta(self, delta: dict) -> dict:
        return _event("content_block_delta", index=self._index, delta=delta)

    def _close(self) -> list[dict]:
        if self._open is None:
            return []
        self._open, self._call = None, None
        return [_event("content_block_stop", index=self._index)]
