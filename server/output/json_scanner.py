"""Character-level JSON syntax checking, and streaming of JSON argument objects.

`JsonScanner` follows one JSON object or array a character at a time. `ArgsStreamer` uses it
to pass on argument text as the model writes it, and to tell where the object closes or breaks;
it never adds text of its own to close an object the model left open.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .markers import WHITESPACE

_NUMBER_RE = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_NUMBER_CHARS = frozenset("0123456789+-.eE")
_LITERALS = {"t": "rue", "f": "alse", "n": "ull"}
_HEX = frozenset("0123456789abcdefABCDEF")
_SIMPLE_ESCAPES = frozenset('"\\/bfnrt')
_CONTROL_ESCAPES = {"\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_control(ch: str) -> str:
    """JSON escape for a raw control character found inside a string."""
    return _CONTROL_ESCAPES.get(ch) or f"\\u{ord(ch):04x}"


class JsonScanner:
    """Checks the syntax of one JSON object or array, one character at a time.

    `push` answers the text to output for the character (itself, or an escape for a raw
    control character inside a string) or None when the character cannot continue valid JSON.
    """

    __slots__ = ("stack", "state", "_literal", "_number", "_hex_left", "_top")

    def __init__(self, top: str = "{[") -> None:
        self.stack: list[str] = []
        self.state = "value"
        self._literal = ""
        self._number = ""
        self._hex_left = 0
        self._top = top

    @classmethod
    def after_object_member(cls) -> "JsonScanner":
        """A scanner positioned just after a member value inside an open object."""
        scanner = cls()
        scanner.stack = ["{"]
        scanner.state = "after"
        return scanner

    @property
    def done(self) -> bool:
        return self.state == "done"

    def push(self, ch: str) -> str | None:
        handler = getattr(self, "_on_" + self.state)
        return handler(ch)

    def _value_done(self) -> None:
        self.state = "after" if self.stack else "done"

    def _on_value(self, ch: str) -> str | None:
        if ch in WHITESPACE:
            return ch
        if not self.stack:
            if ch not in self._top:
                return None
        if ch == "{":
            self.stack.append("{")
            self.state = "obj_first"
        elif ch == "[":
            self.stack.append("[")
            self.state = "arr_first"
        elif ch == '"':
            self.state = "str"
        elif ch == "-" or ch.isdigit() and ch.isascii():
            self._number = ch
            self.state = "num"
        elif ch in _LITERALS:
            self._literal = _LITERALS[ch]
            self.state = "lit"
        else:
            return None
        return ch

    def _on_arr_first(self, ch: str) -> str | None:
        if ch == "]":
            self.stack.pop()
            self._value_done()
            return ch
        if ch in WHITESPACE:
            return ch
        self.state = "value"
        return self._on_value(ch)

    def _on_obj_first(self, ch: str) -> str | None:
        if ch == "}":
            self.stack.pop()
            self._value_done()
            return ch
        return self._on_obj_key(ch)

    def _on_obj_key(self, ch: str) -> str | None:
        if ch in WHITESPACE:
            return ch
        if ch == '"':
            self.state = "key"
            return ch
        return None

    def _string_char(self, ch: str, kind: str) -> str | None:
        if ch == '"':
            if kind == "key":
                self.state = "colon"
            else:
                self._value_done()
            return ch
        if ch == "\\":
            self.state = kind + "_esc"
            return ch
        if ch < " ":
            return _escape_control(ch)
        return ch

    def _escape_char(self, ch: str, kind: str) -> str | None:
        if ch in _SIMPLE_ESCAPES:
            self.state = kind
            return ch
        if ch == "u":
            self._hex_left = 4
            self.state = kind + "_u"
            return ch
        return None

    def _hex_char(self, ch: str, kind: str) -> str | None:
        if ch not in _HEX:
            return None
        self._hex_left -= 1
        if self._hex_left == 0:
            self.state = kind
        return ch

    def _on_key(self, ch: str) -> str | None:
        return self._string_char(ch, "key")

    def _on_key_esc(self, ch: str) -> str | None:
        return self._escape_char(ch, "key")

    def _on_key_u(self, ch: str) -> str | None:
        return self._hex_char(ch, "key")

    def _on_str(self, ch: str) -> str | None:
        return self._string_char(ch, "str")

    def _on_str_esc(self, ch: str) -> str | None:
        return self._escape_char(ch, "str")

    def _on_str_u(self, ch: str) -> str | None:
        return self._hex_char(ch, "str")

    def _on_colon(self, ch: str) -> str | None:
        if ch in WHITESPACE:
            return ch
        if ch == ":":
            self.state = "value"
            return ch
        return None

    def _on_num(self, ch: str) -> str | None:
        if ch in _NUMBER_CHARS:
            self._number += ch
            return ch
        if _NUMBER_RE.fullmatch(self._number) is None:
            return None
        self._value_done()
        return self.push(ch)

    def _on_lit(self, ch: str) -> str | None:
        if ch != self._literal[0]:
            return None
        self._literal = self._literal[1:]
        if not self._literal:
            self._value_done()
        return ch

    def _on_after(self, ch: str) -> str | None:
        if ch in WHITESPACE:
            return ch
        if ch == ",":
            self.state = "obj_key" if self.stack[-1] == "{" else "value"
            return ch
        if (ch == "}" and self.stack[-1] == "{") or (ch == "]" and self.stack[-1] == "["):
            self.stack.pop()
            self._value_done()
            return ch
        return None

    def _on_done(self, ch: str) -> str | None:
        return None


@dataclass(slots=True)
class ScanStep:
    """What an `ArgsStreamer` made of some input."""

    fragment: str  # the model's text of the object (raw control characters escaped)
    state: str  # "open", "done" (the object closed) or "broken" (it cannot continue)
    rest: str  # input after the object, or from the character that broke it


class ArgsStreamer:
    """Streams the text of one JSON object as it arrives, up to where it closes or breaks."""

    def __init__(self) -> None:
        self._scanner = JsonScanner(top="{")

    def feed(self, text: str) -> ScanStep:
        emitted: list[str] = []
        for i, ch in enumerate(text):
            out = self._scanner.push(ch)
            if out is None:
                return ScanStep("".join(emitted), "broken", text[i:])
            emitted.append(out)
            if self._scanner.done:
                return ScanStep("".join(emitted), "done", text[i + 1 :])
        return ScanStep("".join(emitted), "open", "")
