"""Tool calls written as JSON objects: the accepted shapes, and a streaming reader of one call."""

from __future__ import annotations

import json
import re
from typing import Any

from .parsed import dump_arguments
from .json_scanner import ArgsStreamer, JsonScanner, ScanStep
from .markers import WHITESPACE
from .sink import EventSink


def arguments_text(value: Any) -> str | None:
    """Serialised arguments from a parsed value: an object, JSON text of one, or null."""
    if value is None:
        return "{}"
    if isinstance(value, str):
        try:
            value = json.loads(value, strict=False)
        except ValueError:
            return None
    if isinstance(value, dict):
        return dump_arguments(value)
    return None


def call_from_object(obj: Any) -> tuple[str, str, str | None] | None:
    """(name, arguments, id) from one call object in any of the accepted JSON shapes."""
    if not isinstance(obj, dict):
        return None
    call_id = obj.get("id")
    if isinstance(obj.get("function"), dict):
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    raw_args = obj["arguments"] if "arguments" in obj else obj.get("parameters")
    arguments = arguments_text(raw_args)
    if arguments is None:
        return None
    return name.strip(), arguments, call_id if isinstance(call_id, str) else None


def calls_from_json(value: Any) -> list[tuple[str, str, str | None]] | None:
    """Calls from a call object, a list of them, or ``{"tool_calls": [...]}``; None if not calls."""
    if isinstance(value, dict) and isinstance(value.get("tool_calls"), list):
        value = value["tool_calls"]
    items = value if isinstance(value, list) else [value]
    calls = [call_from_object(item) for item in items]
    if not calls or any(call is None for call in calls):
        return None
    return calls  # type: ignore[return-value]


_KEEPABLE_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")


def keepable_id(call_id: str | None) -> str | None:
    """A model-given call id that is safe to pass on (Mistral's 9-char ids), else None."""
    if call_id and _KEEPABLE_ID_RE.fullmatch(call_id):
        return call_id
    return None


_HEADER_RE = re.compile(
    r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*', re.S
)


class JsonCallReader:
    """Reads one ``{"name": ..., "arguments": {...}}`` object (also ``"parameters"``).

    When the object starts with the name followed by an object of arguments, the call is
    announced as soon as the arguments begin and they are streamed as the model writes them;
    the sink judges the call when they close (or records it failed when they break). Otherwise
    the object is held until it is complete and then read whole, and it is a call only if its
    arguments are valid. `status` becomes "ended" (a call was emitted; `rest` is the input
    after it, possibly junk) or "failed" (no call; `raw` is the text consumed, `rest` what
    followed the failing character).
    """

    def __init__(self, out: EventSink) -> None:
        self._out = out
        self._scanner = JsonScanner(top="{")
        self._raw: list[str] = []
        self._prev_significant = ""
        self._streamer: ArgsStreamer | None = None
        self._tail: JsonScanner | None = None
        self._index = -1
        self.status = "open"
        self.rest = ""

    @property
    def raw(self) -> str:
        return "".join(self._raw)

    def feed(self, text: str) -> None:
        if self._tail is not None:
            self._feed_tail(text)
        elif self._streamer is not None:
            self._feed_arguments(text)
        else:
            self._feed_header(text)

    def finish(self, at_end: bool = True) -> None:
        """No more input for this object. Arguments still open stay open `at_end` of the
        output (the parser names that call as cut); anywhere else the call failed."""
        if self._tail is not None:
            self.status = "ended"
        elif self._streamer is not None:
            if not at_end:
                self._out.abandon_call(self._index)
            self.status, self.rest = "ended", ""
        else:
            self.status = "failed"

    def _feed_header(self, text: str) -> None:
        for i, ch in enumerate(text):
            if ch not in WHITESPACE:
                if ch == "{" and self._prev_significant == ":" and len(self._scanner.stack) == 1:
                    if self._commit():
                        self._feed_arguments(text[i:])
                        return
                self._prev_significant = ch
            if self._scanner.push(ch) is None:
                self._raw.append(ch)
                self.status, self.rest = "failed", text[i + 1 :]
                return
            self._raw.append(ch)
            if self._scanner.done:
                self._read_whole()
                self.rest = text[i + 1 :]
                return

    def _commit(self) -> bool:
        """Announce the call if the text so far is exactly the name and the arguments key."""
        match = _HEADER_RE.fullmatch(self.raw)
        if match is None:
            return False
        try:
            name = json.loads('"' + match.group(1) + '"', strict=False).strip()
        except ValueError:
            return False
        if not name:
            return False
        self._index = self._out.open_call(name)
        self._streamer = ArgsStreamer()
        return True

    def _read_whole(self) -> None:
        try:
            call = call_from_object(json.loads(self.raw, strict=False))
        except ValueError:
            call = None
        if call is None or not self._out.valid(call[0], call[1]):
            self.status = "failed"
            return
        name, arguments, _ = call
        self._out.whole_call(name, None, arguments)
        self.status = "ended"

    def _feed_arguments(self, text: str) -> None:
        assert self._streamer is not None
        self._apply(self._streamer.feed(text))

    def _apply(self, step: ScanStep) -> None:
        self._out.arguments(self._index, step.fragment)
        if step.state == "done":
            self._out.close_call(self._index)
            self._tail = JsonScanner.after_object_member()
            self._feed_tail(step.rest)
        elif step.state == "broken":
            self._out.abandon_call(self._index)
            self.status, self.rest = "ended", step.rest

    def _feed_tail(self, text: str) -> None:
        """After the arguments: the rest of the object (further members, the closing brace)."""
        assert self._tail is not None
        for i, ch in enumerate(text):
            if self._tail.push(ch) is None:
                self.status, self.rest = "ended", text[i:]
                return
            if self._tail.done:
                self.status, self.rest = "ended", text[i + 1 :]
                return
