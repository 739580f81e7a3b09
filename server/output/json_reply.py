"""Replies that are JSON calls as a whole (the generic ``json`` format), and plain content (``none``)."""

from __future__ import annotations

import json

from .json_calls import calls_from_json, keepable_id
from .json_scanner import JsonScanner
from .markers import WHITESPACE
from .sink import EventSink


class PlainLayer:
    """No tool calls: everything is content."""

    def __init__(self, out: EventSink) -> None:
        self._out = out

    def feed(self, text: str) -> None:
        self._out.content(text)

    def finish(self) -> None:
        pass


_FENCE = "```"


class JsonReplyLayer:
    """The whole reply (optionally in a ```json fence) is a call, a list of calls, or content."""

    def __init__(self, out: EventSink) -> None:
        self._out = out
        self._state = "start"  # start, value, after, content
        self._buf = ""
        self._prefix = ""  # whitespace and fence before the value
        self._raw: list[str] = []  # the value so far
        self._fenced = False
        self._scanner: JsonScanner | None = None

    def feed(self, text: str) -> None:
        self._buf += text
        while self._buf and getattr(self, "_in_" + self._state)():
            pass

    def finish(self) -> None:
        rest = self._buf
        if self._state == "value":
            rest = self._prefix + "".join(self._raw) + rest
        elif self._state == "after":
            rest = rest.strip(WHITESPACE)
            if self._fenced and _FENCE.startswith(rest):
                rest = ""
        self._out.content(rest)
        self._buf = ""

    def _in_content(self) -> bool:
        self._out.content(self._buf)
        self._buf = ""
        return False

    def _in_start(self) -> bool:
        head = self._buf.lstrip(WHITESPACE)
        fenced = head.startswith(_FENCE)
        if fenced:
            label = head[len(_FENCE) :]
            if "json".startswith(label):
                return False
            head = (label[4:] if label.startswith("json") else label).lstrip(WHITESPACE)
        elif _FENCE.startswith(head):
            return False
        if not head:
            return False
        if head[0] not in "{[":
            self._state = "content"
            return True
        self._prefix = self._buf[: len(self._buf) - len(head)]
        self._buf = head
        self._fenced = fenced
        self._scanner = JsonScanner()
        self._state = "value"
        return True

    def _in_value(self) -> bool:
        assert self._scanner is not None
        for i, ch in enumerate(self._buf):
            self._raw.append(ch)
            if self._scanner.push(ch) is None:
                return self._give_up(self._buf[i + 1 :])
            if self._scanner.done:
                return self._end_value(self._buf[i + 1 :])
        self._buf = ""
        return False

    def _give_up(self, rest: str) -> bool:
        self._buf = self._prefix + "".join(self._raw) + rest
        self._raw = []
        self._state = "content"
        return True

    def _end_value(self, rest: str) -> bool:
        try:
            calls = calls_from_json(json.loads("".join(self._raw), strict=False))
        except ValueError:
            calls = None
        if calls is None or not all(self._out.valid(name, arguments) for name, arguments, _ in calls):
            return self._give_up(rest)
        for name, arguments, call_id in calls:
            self._out.whole_call(name, keepable_id(call_id), arguments)
        self._raw = []
        self._buf = rest
        self._state = "after"
        return True

    def _in_after(self) -> bool:
        head = self._buf.lstrip(WHITESPACE)
        if not head:
            return False
        if self._fenced:
            if _FENCE.startswith(head):
                return False
            if head.startswith(_FENCE):
                head = head[len(_FENCE) :]
        self._buf = head
        self._state = "content"
        return True
