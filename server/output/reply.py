"""What a reply's parsed output means: the streamed and the whole-reply views of one rule.

A reply cut inside a tool call must never pass a call that did not close as a whole one. The
streamed view sends each call whole once it closed and validates, and ends with the parser's
`cut` and `cut_index` (the number of the call the end of output cut, never sent); the whole
view keeps the same calls.
"""

from __future__ import annotations

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
    """A whole reply parsed: it keeps only the calls whose arguments closed in the model's own
    text and are valid for their tool (a call cut by max_tokens is `parser.cut_index`)."""
    return parser.parse_complete(text, truncated=finish is FinishReason.LENGTH)
