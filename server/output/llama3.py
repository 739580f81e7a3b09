"""The Llama 3.x format: the whole reply is JSON call objects, optionally after ``<|python_tag|>``."""

from __future__ import annotations

from .json_calls import JsonCallReader
from .markers import PYTHON_TAG, WHITESPACE
from .sink import EventSink


class Llama3Layer:
    """A reply made of JSON call objects (optionally after ``<|python_tag|>``), else content."""

    def __init__(self, out: EventSink) -> None:
        self._out = out
        self._state = "start"  # start, call, between, content
        self._buf = ""
        self._segment = ""  # text of the current call attempt before its object
        self._reader: JsonCallReader | None = None

    def feed(self, text: str) -> None:
        self._buf += text
        while self._buf:
            if self._state == "content":
                self._out.content(self._buf)
                self._buf = ""
            elif self._state == "call":
                self._feed_call()
            elif not self._start_or_between():
                return

    def finish(self) -> None:
        if self._state == "call":
            assert self._reader is not None
            self._reader.finish()
            self._after_reader()
        rest = self._buf
        if self._state == "between":
            rest = rest.lstrip(WHITESPACE + ";")
            rest = "" if PYTHON_TAG.startswith(rest.rstrip(WHITESPACE)) else rest
        self._out.content(rest)
        self._buf = ""

    def _start_or_between(self) -> bool:
        """Decide whether held text starts a call; False while undecided."""
        if self._state == "between":
            self._buf = self._buf.lstrip(WHITESPACE + ";")
        head = self._buf.lstrip(WHITESPACE)
        if head.startswith(PYTHON_TAG):
            head = head[len(PYTHON_TAG) :].lstrip(WHITESPACE)
        elif PYTHON_TAG.startswith(head):
            return False
        if not head:
            return False
        if head[0] == "{":
            self._segment = self._buf[: len(self._buf) - len(head)]
            self._buf = head
            self._state = "call"
            self._reader = JsonCallReader(self._out)
        else:
            self._state = "content"
        return True

    def _feed_call(self) -> None:
        assert self._reader is not None
        text, self._buf = self._buf, ""
        self._reader.feed(text)
        self._after_reader()

    def _after_reader(self) -> None:
        assert self._reader is not None
        if self._reader.status == "ended":
            self._state = "between"
        elif self._reader.status == "failed":
            self._state = "content"
            self._out.content(self._segment + self._reader.raw)
        else:
            return
        self._buf = self._reader.rest + self._buf
        self._segment = ""
        self._reader = None
