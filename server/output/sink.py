"""Where the format layers put their output: one list of events per feed or finish call."""

from __future__ import annotations

from typing import Callable

from .events import ContentDelta, Event, ReasoningDelta, ToolCallDelta
from .markers import WHITESPACE


class TrimSink:
    """Passes text on, dropping whitespace at its edges when asked to.

    Trailing whitespace is held (when `hold_ws`) until more text shows it is not the end;
    after `cut` the next leading whitespace is dropped.
    """

    def __init__(self, hold_ws: bool, strip_leading: bool = False) -> None:
        self.hold_ws = hold_ws
        self.strip_leading = strip_leading
        self.held = ""

    def add(self, text: str) -> str:
        if self.strip_leading:
            text = text.lstrip(WHITESPACE)
            if not text:
                return ""
            self.strip_leading = False
        if not self.hold_ws:
            return text
        text = self.held + text
        body = text.rstrip(WHITESPACE)
        self.held = text[len(body) :]
        return body

    def cut(self) -> None:
        """A boundary: drop held whitespace and the whitespace that follows."""
        self.held = ""
        self.strip_leading = True

    def end(self, keep_held: bool) -> str:
        held, self.held = self.held, ""
        return held if keep_held else ""


class EventSink:
    """Collects the events of one feed/finish call, shared by all parsing stages."""

    def __init__(
        self,
        id_factory: Callable[[], str],
        hold_ws: bool,
        check: Callable[[str, str], bool] = lambda name, arguments: True,
    ) -> None:
        self.events: list[Event] = []
        self.content_sink = TrimSink(hold_ws)
        self.reasoning_sink = TrimSink(hold_ws=True, strip_leading=True)
        self._id_factory = id_factory
        self.valid = check  # (name, arguments text) -> whether the call stands
        self.calls = 0
        self.open_index: int | None = None  # the call whose arguments are being streamed
        self.failed: list[int] = []  # calls sent in part that did not close into valid arguments
        self._open_name = ""
        self._open_arguments: list[str] = []

    def content(self, text: str) -> None:
        text = self.content_sink.add(text)
        if text:
            self.events.append(ContentDelta(text))

    def reasoning(self, text: str) -> None:
        text = self.reasoning_sink.add(text)
        if text:
            self.events.append(ReasoningDelta(text))

    def end_reasoning(self) -> None:
        self.reasoning_sink.end(keep_held=False)
        self.content_sink.cut()

    def open_call(self, name: str, call_id: str | None = None) -> int:
        """Start call number `calls`, whose arguments follow as the model writes them
        (`arguments`) until `close_call` or `abandon_call`; whitespace around it is dropped
        from content."""
        assert self.open_index is None, "one call is streamed at a time"
        index = self._new_call(name, call_id, "")
        self.open_index, self._open_name, self._open_arguments = index, name, []
        return index

    def whole_call(self, name: str, call_id: str | None, arguments: str) -> int:
        """A call read whole, its arguments already checked with `valid`."""
        assert self.open_index is None, "one call is streamed at a time"
        return self._new_call(name, call_id, arguments)

    def _new_call(self, name: str, call_id: str | None, arguments: str) -> int:
        self.content_sink.cut()
        index = self.calls
        self.calls += 1
        self.events.append(ToolCallDelta(index, call_id or self._id_factory(), name, arguments))
        return index

    def arguments(self, index: int, text: str) -> None:
        """More of the open call's arguments: only text the model wrote, never a closer."""
        assert index == self.open_index
        if text:
            self._open_arguments.append(text)
            self.events.append(ToolCallDelta(index, None, None, text))

    def close_call(self, index: int) -> None:
        """The model closed the open call's arguments: the call stands if they are valid."""
        assert index == self.open_index
        if not self.valid(self._open_name, "".join(self._open_arguments)):
            self.failed.append(index)
        self._end_open()

    def abandon_call(self, index: int) -> None:
        """The open call will not close (its JSON broke, its block ended, the output ended)."""
        assert index == self.open_index
        self.failed.append(index)
        self._end_open()

    def _end_open(self) -> None:
        self.open_index, self._open_name, self._open_arguments = None, "", []

    def end(self) -> None:
        """End of output: held trailing content whitespace survives only without calls."""
        held = self.content_sink.end(keep_held=self.calls == 0)
        if held:
            self.events.append(ContentDelta(held))

    def take(self) -> list[Event]:
        events, self.events = merge_events(self.events), []
        return events


def merge_events(events: list[Event]) -> list[Event]:
    """Join neighbouring deltas of the same kind (and call) into one."""
    merged: list[Event] = []
    for event in events:
        last = merged[-1] if merged else None
        if isinstance(event, ContentDelta) and isinstance(last, ContentDelta):
            merged[-1] = ContentDelta(last.text + event.text)
        elif isinstance(event, ReasoningDelta) and isinstance(last, ReasoningDelta):
            merged[-1] = ReasoningDelta(last.text + event.text)
        elif (
            isinstance(event, ToolCallDelta)
            and isinstance(last, ToolCallDelta)
            and event.id is None
            and last.index == event.index
        ):
            merged[-1] = ToolCallDelta(last.index, last.id, last.name, last.arguments + event.arguments)
        else:
            merged.append(event)
    return merged
