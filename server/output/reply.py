"""What a reply's parsed output means: the streamed and the whole-reply views of one rule.

A reply cut inside a tool call must never pass a call that did not close as a whole one. The
streamed view sends only text the model wrote and ends with the parser's `cut` and
`cut_index` (the call to name as incomplete; `failed` lists every call sent in part that did
not become whole); the whole view keeps only the calls that closed and validate.
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
