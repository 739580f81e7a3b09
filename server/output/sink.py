"""Where the format layers put their output: one list of events per feed or finish call."""

from __future__ import annotations

from typing import Callable

from .parsed import ContentDelta, Event, ReasoningDelta, ToolCallDelta
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
        hold_calls: bool = True,
    ) -> None:
        self.events: list[Event] = []
        self.content_sink = TrimSink(hold_ws)
        self.reasoning_sink = TrimSink(hold_ws=True, strip_leading=True)
        self._id_factory = id_factory
        self.valid = check  # (name, arguments text) -> whether the call stands
        # Hold a call's deltas until it closed and validated: a client that gathers streamed
        # fragments (llama-index) runs whatever call it was sent, even one that never closed.
        # Off, the arguments stream as the model writes them, and `failed` names the calls
        # sent in part that did not become whole.
        self.hold_calls = hold_calls
        self.calls = 0  # calls sent (held ones count once released)
        self.open_index: int | None = None  # the call whose arguments are being read
        self.failed: list[int] = []  # calls that did not become whole (see hold_calls)
        self._open_name = ""
        self._open_arguments: list[str] = []
        self._held: list[Event] = []

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
        index = self._new_call(name, call_id, "", held=self.hold_calls)
        self.open_index, self._open_name, self._open_arguments = index, name, []
        return index

    def whole_call(self, name: str, call_id: str | None, arguments: str) -> int:
        """A call read whole, its arguments already checked with `valid`."""
        assert self.open_index is None, "one call is streamed at a time"
        return self._new_call(name, call_id, arguments)

    def _new_call(self, name: str, call_id: str | None, arguments: str, held: bool = False) -> int:
        """A held call takes the next number but counts (and is sent) only once released."""
        self.content_sink.cut()
        index = self.calls
        delta = ToolCallDelta(index, call_id or self._id_factory(), name, arguments)
        if held:
            self._held = [delta]
        else:
            self.calls += 1
            self.events.append(delta)
        return index

    def arguments(self, index: int, text: str) -> None:
        """More of the open call's arguments: only text the model wrote, never a closer."""
        assert index == self.open_index
        if text:
            self._open_arguments.append(text)
            (self._held if self.hold_calls else self.events).append(ToolCallDelta(index, None, None, text))

    def close_call(self, index: int) -> None:
        """The model closed the open call's arguments: the call stands if they are valid."""
        assert index == self.open_index
        if not self.valid(self._open_name, "".join(self._open_arguments)):
            self.failed.append(index)
        elif self.hold_calls:
            self.calls += 1
            self.events.extend(self._held)
        self._end_open()

    def abandon_call(self, index: int) -> None:
        """The open call will not close (its JSON broke, its block ended, the output ended)."""
        assert index == self.open_index
        self.failed.append(index)
        self._end_open()

    def _end_open(self) -> None:
        self.open_index, self._open_name, self._open_arguments, self._held = None, "", [], []

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
