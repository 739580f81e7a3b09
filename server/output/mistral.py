"""The Mistral format: ``[TOOL_CALLS]`` and a JSON array of calls, or ``NAME[CALL_ID]ID[ARGS]{...}``."""

from __future__ import annotations

import json
import re
from typing import Callable

from .json_calls import calls_from_json, keepable_id
from .json_scanner import ArgsStreamer, JsonScanner, ScanStep
from .markers import MISTRAL_ARGS, MISTRAL_CALL_ID, MISTRAL_CALLS, WHITESPACE, partial_marker_len
from .sink import EventSink

_MISTRAL_NAME_RE = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_MISTRAL_ID_RE = re.compile(r"[A-Za-z0-9]{1,64}")
_NAME_CHAR_RE = re.compile(r"[A-Za-z0-9_.:-]")
_ID_CHAR_RE = re.compile(r"[A-Za-z0-9]")


class MistralLayer:
    """``[TOOL_CALLS]`` followed by a JSON array of calls or by ``NAME[CALL_ID]ID[ARGS]{...}``."""

    def __init__(self, out: EventSink, id_factory: Callable[[], str]) -> None:
        self._out = out
        self._id_factory = id_factory
        self._state = "content"  # content, start, array, name, call_id, args_wait, args
        self._buf = ""
        self._reset_call()

    def _reset_call(self) -> None:
        self._segment: list[str] = []
        self._scanner: JsonScanner | None = None
        self._streamer: ArgsStreamer | None = None
        self._name = ""
        self._field = ""
        self._marker = ""
        self._call_id: str | None = None
        self._index = -1

    def feed(self, text: str) -> None:
        self._buf += text
        while self._buf and getattr(self, "_in_" + self._state)():
            pass

    def finish(self) -> None:
        if self._state == "args":  # the output ended inside the arguments: the call stays open
            self._reset_call()
            self._state = "content"
        if self._state == "content":
            self._out.content(self._buf)
        else:
            self._out.content("".join(self._segment) + self._buf)
        self._buf = ""
        self._state = "content"

    def _consume(self, size: int) -> str:
        taken, self._buf = self._buf[:size], self._buf[size:]
        self._segment.append(taken)
        return taken

    def _fail(self) -> bool:
        """Not a call after all: everything since the marker is content."""
        self._out.content("".join(self._segment))
        self._reset_call()
        self._state = "content"
        return True

    def _in_content(self) -> bool:
        pos = self._buf.find(MISTRAL_CALLS)
        if pos < 0:
            keep = partial_marker_len(self._buf, (MISTRAL_CALLS,))
            self._out.content(self._buf[: len(self._buf) - keep])
            self._buf = self._buf[len(self._buf) - keep :]
            return False
        self._out.content(self._buf[:pos])
        self._buf = self._buf[pos:]
        self._reset_call()
        self._consume(len(MISTRAL_CALLS))
        self._state = "start"
        return True

    def _in_start(self) -> bool:
        head = self._buf.lstrip(WHITESPACE)
        if not head:
            self._consume(len(self._buf))
            return False
        self._consume(len(self._buf) - len(head))
        if head[0] == "[":
            self._scanner = JsonScanner(top="[")
            self._state = "array"
        else:
            self._state = "name"
        return True

    def _in_array(self) -> bool:
        assert self._scanner is not None
        for i, ch in enumerate(self._buf):
            if self._scanner.push(ch) is None:
                self._consume(i + 1)
                return self._fail()
            if self._scanner.done:
                self._consume(i + 1)
                return self._end_array()
        self._consume(len(self._buf))
        return False

    def _end_array(self) -> bool:
        raw = "".join(self._segment)[len(MISTRAL_CALLS) :]
        try:
            value = json.loads(raw, strict=False)
        except ValueError:
            return self._fail()
        calls = calls_from_json(value) if isinstance(value, list) else None
        if calls is None or not all(self._out.valid(name, arguments) for name, arguments, _ in calls):
            return self._fail()
        for name, arguments, call_id in calls:
            self._out.whole_call(name, keepable_id(call_id), arguments)
        self._reset_call()
        self._state = "content"
        return True

    def _read_field(self, chars: re.Pattern[str], markers: tuple[str, ...], limit: int) -> str | None:
        """Read a name or id up to one of `markers` (consumed); None while it has not come.

        Leading whitespace is skipped; the first character that cannot belong to the field or
        start a marker fails the call, and that character is read again as content.
        """
        for i, ch in enumerate(self._buf):
            if ch == "[":
                rest = self._buf[i:]
                marker = next((m for m in markers if rest.startswith(m)), None)
                if marker is not None:
                    field = self._field + self._consume(i)
                    self._consume(len(marker))
                    self._field, self._marker = "", marker
                    return field.strip(WHITESPACE)
                if any(m.startswith(rest) for m in markers):
                    self._field += self._consume(i)
                    return None
            elif chars.fullmatch(ch) or (ch in WHITESPACE and not (self._field + self._buf[:i]).strip(WHITESPACE)):
                if len(self._field) + i < limit:
                    continue
            self._consume(i)
            self._fail()
            return None
        self._field += self._consume(len(self._buf))
        return None

    def _in_name(self) -> bool:
        name = self._read_field(_NAME_CHAR_RE, (MISTRAL_ARGS, MISTRAL_CALL_ID), limit=160)
        if name is None:
            return self._state == "content"
        if not _MISTRAL_NAME_RE.fullmatch(name):
            return self._fail()
        self._name = name
        self._state = "call_id" if self._marker == MISTRAL_CALL_ID else "args_wait"
        return True

    def _in_call_id(self) -> bool:
        call_id = self._read_field(_ID_CHAR_RE, (MISTRAL_ARGS,), limit=80)
        if call_id is None:
            return self._state == "content"
        if not _MISTRAL_ID_RE.fullmatch(call_id):
            return self._fail()
        self._call_id = call_id
        self._state = "args_wait"
        return True

    def _in_args_wait(self) -> bool:
        head = self._buf.lstrip(WHITESPACE)
        self._consume(len(self._buf) - len(head))
        if not head:
            return False
        if head[0] != "{":
            return self._fail()
        self._index = self._out.open_call(self._name, self._call_id)
        self._streamer = ArgsStreamer()
        self._state = "args"
        return True

    def _in_args(self) -> bool:
        assert self._streamer is not None
        text, self._buf = self._buf, ""
        self._end_arguments(self._streamer.feed(text))
        return True

    def _end_arguments(self, step: ScanStep) -> None:
        self._out.arguments(self._index, step.fragment)
        if step.state == "done":
            self._out.close_call(self._index)
        elif step.state == "broken":
            self._out.abandon_call(self._index)
        if step.state != "open":
            self._buf = step.rest + self._buf
            self._reset_call()
            self._state = "content"
