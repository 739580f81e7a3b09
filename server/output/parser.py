"""`OutputParser`: picks the format layer for a request and splits reasoning off the output."""

from __future__ import annotations

from typing import Any, Callable, Protocol

from .parsed import ContentDelta, Event, ParsedMessage, collect, new_call_id
from .hermes import HermesLayer, parameter_schemas
from .json_reply import JsonReplyLayer, PlainLayer
from .llama3 import Llama3Layer
from .markers import FORMATS, HERMES_FORMATS, HERMES_OPEN, THINK_CLOSE, THINK_OPEN, WHITESPACE, find_first_marker, partial_marker_len
from .mistral import MistralLayer
from .sink import EventSink
from .validation import ArgumentsCheck


class FormatLayer(Protocol):
    """One tool-call format: takes content text (reasoning already split off) and emits events."""

    def feed(self, text: str) -> None: ...

    def finish(self) -> None: ...


class OutputParser:
    """Incremental parser of one generated assistant message.

    Options:
      format: one of `FORMATS`, the tool-call syntax to recognise.
      reasoning: split a ``<think>...</think>`` block at the start of the output into reasoning.
      starts_in_reasoning: the prompt already opened the think block, so the output begins
        inside reasoning until ``</think>`` (a repeated ``<think>`` at the start is skipped).
      tools_enabled: when False no tool calls are recognised; everything is content.
      id_factory: makes call ids (default `new_call_id`); model-given ids are kept where the
        format carries them (Mistral).
      tools: the request's OpenAI `tools`: a call stands only if its arguments are valid
        against its tool's parameters (`ArgumentsCheck`); XML string parameters stay text.

      stream_arguments: send a JSON call's arguments as the model writes them. By default
        each call is sent whole once its arguments closed in the model's own text and
        validate: a client that gathers streamed fragments runs whatever call it was sent
        (llama-index ran a call cut by max_tokens), so only whole calls are ever sent.

    A call whose arguments did not close or validate is listed in `failed` (with
    `stream_arguments`, these are calls already sent in part, to leave out of the whole
    message); the one the end of output cut is `cut_index` (the number it had or would have
    had). Nothing is ever added to close arguments the model left open.

    For Hermes formats a ``<tool_call>`` inside reasoning also ends the reasoning (Qwen3.5 may
    open its call without closing the think block).
    """

    def __init__(
        self,
        format: str = "hermes",
        *,
        reasoning: bool = False,
        starts_in_reasoning: bool = False,
        tools_enabled: bool = True,
        id_factory: Callable[[], str] | None = None,
        tools: list[dict[str, Any]] | None = None,
        stream_arguments: bool = False,
    ) -> None:
        if format not in FORMATS:
            raise ValueError(f"unknown tool call format {format!r}; expected one of {FORMATS}")
        self.format = format
        factory = id_factory or new_call_id
        parse_tools = tools_enabled and format != "none"
        self._out = EventSink(factory, hold_ws=parse_tools, check=ArgumentsCheck(tools), hold_calls=not stream_arguments)
        self._layer = self._make_layer(format if parse_tools else "none", factory, tools)
        self._reasoning_ends = (THINK_CLOSE,)
        if parse_tools and format in HERMES_FORMATS:
            self._reasoning_ends = (THINK_CLOSE, HERMES_OPEN)
        if starts_in_reasoning:
            self._mode = "opening"
        elif reasoning:
            self._mode = "detect"
        else:
            self._mode = "content"
        self._buf = ""
        self._finished = False
        self.cut = False  # the output was cut inside a tool call or its markup (see finish)
        self.cut_index: int | None = None  # the call the end of output cut (see finish)

    def _make_layer(
        self, format: str, factory: Callable[[], str], tools: list[dict[str, Any]] | None
    ) -> FormatLayer:
        if format in HERMES_FORMATS:
            return HermesLayer(self._out, parameter_schemas(tools))
        if format == "llama3":
            return Llama3Layer(self._out)
        if format == "mistral":
            return MistralLayer(self._out, factory)
        if format == "json":
            return JsonReplyLayer(self._out)
        return PlainLayer(self._out)

    @property
    def in_reasoning(self) -> bool:
        """True while the output fed so far is inside reasoning (meant for gating a lazy grammar)."""
        return self._mode in ("opening", "reasoning")

    @property
    def failed(self) -> list[int]:
        """Calls that never became whole (cut, broken or invalid); see `stream_arguments`."""
        return list(self._out.failed)

    @property
    def has_tool_calls(self) -> bool:
        """True once at least one tool call has been emitted."""
        return self._out.calls > 0

    def feed(self, text: str) -> list[Event]:
        """Parse the next piece of output; answers the events it settles."""
        if self._finished:
            raise RuntimeError("OutputParser.feed() after finish()")
        if text:
            self._route(text)
        return self._out.take()

    def finish(self, truncated: bool = False) -> list[Event]:
        """End of output: flush everything held back.

        A call whose arguments were being streamed is cut: `cut_index` names it, it joins
        `failed`, and `cut` is set, whatever ended the output (max_tokens, a stop string, the
        end of generation). Other unfinished call markup becomes content, unless the output was
        `truncated` (max_tokens): then what the format layer still held (a call not yet
        announced, the start of a marker) is dropped and `cut` is set too, so the markup of a
        cut call never reaches content."""
        if self._finished:
            return []
        self._finished = True
        held, self._buf = self._buf, ""
        if self._mode == "detect":
            self._layer.feed(held)
        elif self._mode in ("opening", "reasoning"):
            self._out.reasoning(held)
            self._out.reasoning_sink.end(keep_held=False)
        self._mode = "content"
        settled = len(self._out.events)
        self._layer.finish()
        if self._out.open_index is not None:
            self.cut_index = self._out.open_index
            self._out.abandon_call(self.cut_index)
            self.cut = True
        if truncated:
            held = self._out.events[settled:]
            if any(isinstance(e, ContentDelta) for e in held):
                self.cut = True
                self._out.events[settled:] = [e for e in held if not isinstance(e, ContentDelta)]
        if self.cut:
            self._out.content_sink.cut()  # the whitespace before the cut markup goes too
        self._out.end()
        return self._out.take()

    def parse_complete(self, text: str, truncated: bool = False) -> ParsedMessage:
        """Parse a whole output at once: identical to streaming it and aggregating the calls
        that became whole (`failed` left out)."""
        events = self.feed(text) + self.finish(truncated)
        return collect(events, drop=() if self._out.hold_calls else self._out.failed)

    def _route(self, text: str) -> None:
        if self._mode == "content":
            self._layer.feed(text)
            return
        self._buf += text
        if self._mode in ("detect", "opening") and not self._open_reasoning():
            return
        if self._mode == "reasoning":
            self._reason()

    def _open_reasoning(self) -> bool:
        """Settle whether the output starts with ``<think>``; False while undecided."""
        head = self._buf.lstrip(WHITESPACE)
        if head.startswith(THINK_OPEN):
            self._buf = head[len(THINK_OPEN) :]
            self._mode = "reasoning"
            return True
        if THINK_OPEN.startswith(head):
            return False
        if self._mode == "opening":
            self._mode = "reasoning"
            return True
        held, self._buf = self._buf, ""
        self._mode = "content"
        self._layer.feed(held)
        return False

    def _reason(self) -> None:
        pos, marker = find_first_marker(self._buf, self._reasoning_ends)
        if pos < 0:
            keep = partial_marker_len(self._buf, self._reasoning_ends)
            self._out.reasoning(self._buf[: len(self._buf) - keep])
            self._buf = self._buf[len(self._buf) - keep :]
            return
        self._out.reasoning(self._buf[:pos])
        self._out.end_reasoning()
        rest = self._buf[pos + len(marker) :] if marker == THINK_CLOSE else self._buf[pos:]
        self._buf = ""
        self._mode = "content"
        self._layer.feed(rest)
