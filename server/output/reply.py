"""What a reply's parsed output means: the streamed and the whole-reply views of one rule.

A reply that `max_tokens` cut inside a tool call must never pass a call that did not close
as a whole one: the streamed view ends with the parser's `cut`, the whole view keeps only
the calls that closed.
"""

from __future__ import annotations

import json

from warmslot.slots import Event, FinishReason

from .parser import OutputParser


def parse_event(parser: OutputParser, ev: Event) -> list:
    """What a streamed event's text adds to the parsed output, and at the end what the parser
    still held (a reply cut by max_tokens inside a tool call ends as `parser.cut`)."""
    outputs = parser.feed(ev.text) if ev.text else []
    if ev.finish is not None:
        outputs += parser.finish(truncated=ev.finish is FinishReason.LENGTH)
    return outputs


def parse_reply(parser: OutputParser, text: str, finish: FinishReason | None):
    """A whole reply parsed; one cut by max_tokens inside a call keeps only its whole calls."""
    return _complete_calls(parser.parse_complete(text, truncated=finish is FinishReason.LENGTH), parser.cut)


def _complete_calls(parsed, cut: bool):
    """A whole reply cut inside a call keeps only the calls whose arguments are whole JSON."""
    if not cut:
        return parsed
    parsed.tool_calls = [c for c in parsed.tool_calls if _is_json(c.arguments)]
    if parsed.content is None and not parsed.tool_calls:
        parsed.content = ""
    return parsed


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True
