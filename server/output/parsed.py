"""What output parsing produces: streamed deltas, whole tool calls and messages."""

from __future__ import annotations

import json
import secrets
import string
from dataclasses import dataclass, field
from typing import Any, Iterable, Union

_ID_ALPHABET = string.ascii_letters + string.digits


@dataclass(slots=True)
class ToolCall:
    """One complete tool call; `arguments` is the JSON text of an object."""

    id: str
    name: str
    arguments: str


@dataclass(slots=True)
class ParsedMessage:
    """A whole assistant message after parsing."""

    content: str | None
    reasoning_content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)


@dataclass(slots=True)
class ContentDelta:
    text: str


@dataclass(slots=True)
class ReasoningDelta:
    text: str


@dataclass(slots=True)
class ToolCallDelta:
    """A piece of tool call `index`: the first carries `id` and `name`, later ones only arguments."""

    index: int
    id: str | None
    name: str | None
    arguments: str


Event = Union[ContentDelta, ReasoningDelta, ToolCallDelta]


def new_call_id() -> str:
    """A fresh OpenAI-style call id: ``call_`` and 24 random alphanumerics."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


def dump_arguments(value: Any) -> str:
    """The one serialisation used whenever arguments are built rather than copied."""
    return json.dumps(value, ensure_ascii=False)


def collect(events: Iterable[Event], drop: Iterable[int] = ()) -> ParsedMessage:
    """Aggregate a stream of events into a message (content is None when empty and calls
    exist); the calls numbered in `drop` (those that never became whole) are left out."""
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, ToolCall] = {}
    for event in events:
        if isinstance(event, ContentDelta):
            content.append(event.text)
        elif isinstance(event, ReasoningDelta):
            reasoning.append(event.text)
        elif event.index in calls:
            calls[event.index].arguments += event.arguments
        else:
            calls[event.index] = ToolCall(event.id or "", event.name or "", event.arguments)
    text = "".join(content)
    thought = "".join(reasoning)
    dropped = set(drop)
    tool_calls = [calls[i] for i in sorted(calls) if i not in dropped]
    return ParsedMessage(
        content=text if text or not tool_calls else None,
        reasoning_content=thought or None,
        tool_calls=tool_calls,
    )
