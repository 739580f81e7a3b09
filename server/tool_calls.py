"""Streaming parsers that split model output into reasoning, content and tool calls.

An `OutputParser` is fed the generated text piece by piece (`feed`) and answers with
events in the shape of OpenAI's streamed deltas: `ContentDelta`, `ReasoningDelta` and
`ToolCallDelta`. `finish` flushes whatever was held back. Feeding the same text in any
chunking yields the same aggregated message, and `parse_complete` is exactly
"feed everything, then finish, then aggregate", so streamed and non-streamed answers agree.

Tool-call formats (`FORMATS`):

- ``hermes``: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` (Hermes,
  Qwen2.5, Qwen3); inside ``<tool_call>`` the XML form
  ``<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>`` is accepted too.
- ``hermes_xml``: the same markers where the model is prompted for the XML form (Qwen3-Coder,
  Qwen3.5). Parsing is identical to ``hermes``; the name exists so grammars can build the XML form.
- ``llama3``: the whole reply is ``{"name": ..., "parameters": {...}}`` (or ``"arguments"``),
  optionally after ``<|python_tag|>``, several separated by ``;`` or newlines.
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}]`` and
  ``[TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...}`` (``[CALL_ID]`` optional), possibly repeated.
- ``json``: the whole reply, optionally fenced with ```` ```json ````, is a call object, a list of
  them, or ``{"tool_calls": [...]}``.
- ``none``: no tool calls.

Text that could still be the start of a call marker is held back until decided; text of a
call never reaches content. A call that turns out malformed before its name and arguments
were recognised comes back verbatim as content. For JSON calls the arguments are streamed as
their raw text arrives, but only up to points where closing the open strings and brackets
yields valid JSON; if such a call is cut short or breaks, the arguments are closed at the last
such point and the rest of the text becomes content. So the concatenated argument fragments
of every call always equal its final ``arguments`` and always parse as JSON. Raw control
characters inside JSON strings are written as escapes.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Union

FORMATS = ("hermes", "hermes_xml", "llama3", "mistral", "json", "none")
HERMES_FORMATS = ("hermes", "hermes_xml")

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
HERMES_OPEN = "<tool_call>"
HERMES_CLOSE = "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
MISTRAL_CALLS = "[TOOL_CALLS]"
MISTRAL_ARGS = "[ARGS]"
MISTRAL_CALL_ID = "[CALL_ID]"

_WS = " \t\r\n"
_ID_ALPHABET = string.ascii_letters + string.digits


# --------------------------------------------------------------------------- types


@dataclass(slots=True)
class ToolCall:
    """One complete tool call; `arguments` is the JSON text of an object."""

    id: str
    name: str
    arguments: str


@dataclass(slots=True)
class ParsedMessage:
    """A whole assistant message after parsing."""

    content: str | None
    reasoning_content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)


@dataclass(slots=True)
class ContentDelta:
    text: str


@dataclass(slots=True)
class ReasoningDelta:
    text: str


@dataclass(slots=True)
class ToolCallDelta:
    """A piece of tool call `index`: the first carries `id` and `name`, later ones only arguments."""

    index: int
    id: str | None
    name: str | None
    arguments: str


Event = Union[ContentDelta, ReasoningDelta, ToolCallDelta]


def new_call_id() -> str:
    """A fresh OpenAI-style call id: ``call_`` and 24 random alphanumerics."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


def dump_arguments(value: Any) -> str:
    """The one serialisation used whenever arguments are built rather than copied."""
    return json.dumps(value, ensure_ascii=False)


def collect(events: Iterable[Event]) -> ParsedMessage:
    """Aggregate a stream of events into a message (content is None when empty and calls exist)."""
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, ToolCall] = {}
    for event in events:
        if isinstance(event, ContentDelta):
            content.append(event.text)
        elif isinstance(event, ReasoningDelta):
            reasoning.append(event.text)
        elif event.index in calls:
            calls[event.index].arguments += event.arguments
        else:
            calls[event.index] = ToolCall(event.id or "", event.name or "", event.arguments)
    text = "".join(content)
    thought = "".join(reasoning)
    tool_calls = [calls[i] for i in sorted(calls)]
    return ParsedMessage(
        content=text if text or not tool_calls else None,
        reasoning_content=thought or None,
        tool_calls=tool_calls,
    )


# --------------------------------------------------------------------------- helpers


def _partial_suffix_len(text: str, markers: Iterable[str]) -> int:
    """Length of the longest end of `text` that is a proper start of one of `markers`."""
    best = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:size]):
                best = size
                break
    return best


def _find_first(text: str, markers: Iterable[str]) -> tuple[int, str]:
    """Position and marker of the earliest occurrence of any marker, or (-1, "")."""
    found, which = -1, ""
    for marker in markers:
        pos = text.find(marker)
        if pos >= 0 and (found < 0 or pos < found):
            found, which = pos, marker
    return found, which


def _arguments_text(value: Any) -> str | None:
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


def _call_from_object(obj: Any) -> tuple[str, str, str | None] | None:
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
    arguments = _arguments_text(raw_args)
    if arguments is None:
        return None
    return name.strip(), arguments, call_id if isinstance(call_id, str) else None


def _calls_from_json(value: Any) -> list[tuple[str, str, str | None]] | None:
    """Calls from a call object, a list of them, or ``{"tool_calls": [...]}``; None if not calls."""
    if isinstance(value, dict) and isinstance(value.get("tool_calls"), list):
        value = value["tool_calls"]
    items = value if isinstance(value, list) else [value]
    calls = [_call_from_object(item) for item in items]
    if not calls or any(call is None for call in calls):
        return None
    return calls  # type: ignore[return-value]


_KEEPABLE_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _keepable_id(call_id: str | None) -> str | None:
    """A model-given call id that is safe to pass on (Mistral's 9-char ids), else None."""
    if call_id and _KEEPABLE_ID_RE.fullmatch(call_id):
        return call_id
    return None


# --------------------------------------------------------------------------- JSON scanning

_NUMBER_RE = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_NUMBER_CHARS = frozenset("0123456789+-.eE")
_LITERALS = {"t": "rue", "f": "alse", "n": "ull"}
_HEX = frozenset("0123456789abcdefABCDEF")
_SIMPLE_ESCAPES = frozenset('"\\/bfnrt')
_CONTROL_ESCAPES = {"\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_SAFE_STATES = frozenset(("str", "after", "obj_first", "arr_first", "done"))


def _escape_control(ch: str) -> str:
    """JSON escape for a raw control character found inside a string."""
    return _CONTROL_ESCAPES.get(ch) or f"\\u{ord(ch):04x}"


class _JsonScanner:
    """Checks the syntax of one JSON object or array, one character at a time.

    `push` answers the text to output for the character (itself, or an escape for a raw
    control character inside a string) or None when the character cannot continue valid JSON.
    `safe` tells whether the text so far becomes valid JSON by appending `closers()`.
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
    def after_object_member(cls) -> "_JsonScanner":
        """A scanner positioned just after a member value inside an open object."""
        scanner = cls()
        scanner.stack = ["{"]
        scanner.state = "after"
        return scanner

    @property
    def done(self) -> bool:
        return self.state == "done"

    @property
    def safe(self) -> bool:
        if self.state == "num":
            return _NUMBER_RE.fullmatch(self._number) is not None
        return self.state in _SAFE_STATES

    def closers(self) -> str:
        """Text that closes the open string and containers."""
        tail = "".join("}" if c == "{" else "]" for c in reversed(self.stack))
        return ('"' if self.state == "str" else "") + tail

    def push(self, ch: str) -> str | None:
        handler = getattr(self, "_on_" + self.state)
        return handler(ch)

    def _value_done(self) -> None:
        self.state = "after" if self.stack else "done"

    def _on_value(self, ch: str) -> str | None:
        if ch in _WS:
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
        if ch in _WS:
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
        if ch in _WS:
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
        if ch in _WS:
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
        if ch in _WS:
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
class _Step:
    """What an `_ArgsStreamer` made of some input."""

    fragment: str
    state: str  # "open", "done" (value complete) or "broken" (closed early)
    rest: str  # input after the value, or the unusable text when broken


class _ArgsStreamer:
    """Streams the text of one JSON object, emitting only prefixes that closers can complete."""

    def __init__(self) -> None:
        self._scanner = _JsonScanner(top="{")
        self._out_tail: list[str] = []
        self._raw_tail: list[str] = []
        self._heal = ""

    def feed(self, text: str) -> _Step:
        emitted: list[str] = []
        for i, ch in enumerate(text):
            out = self._scanner.push(ch)
            if out is None:
                rest = "".join(self._raw_tail) + text[i:]
                return _Step("".join(emitted) + self._heal, "broken", rest)
            self._out_tail.append(out)
            self._raw_tail.append(ch)
            if self._scanner.done:
                emitted.extend(self._out_tail)
                return _Step("".join(emitted), "done", text[i + 1 :])
            if self._scanner.safe:
                emitted.extend(self._out_tail)
                self._out_tail.clear()
                self._raw_tail.clear()
                self._heal = self._scanner.closers()
        return _Step("".join(emitted), "open", "")

    def finish(self) -> _Step:
        """The input ended inside the value: close it at the last safe point."""
        return _Step(self._heal, "broken", "".join(self._raw_tail))


# --------------------------------------------------------------------------- output sinks


class _TrimSink:
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
            text = text.lstrip(_WS)
            if not text:
                return ""
            self.strip_leading = False
        if not self.hold_ws:
            return text
        text = self.held + text
        body = text.rstrip(_WS)
        self.held = text[len(body) :]
        return body

    def cut(self) -> None:
        """A boundary: drop held whitespace and the whitespace that follows."""
        self.held = ""
        self.strip_leading = True

    def end(self, keep_held: bool) -> str:
        held, self.held = self.held, ""
        return held if keep_held else ""


class _Out:
    """Collects the events of one feed/finish call, shared by all parsing stages."""

    def __init__(self, id_factory: Callable[[], str], hold_ws: bool) -> None:
        self.events: list[Event] = []
        self.content_sink = _TrimSink(hold_ws)
        self.reasoning_sink = _TrimSink(hold_ws=True, strip_leading=True)
        self._id_factory = id_factory
        self.calls = 0

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

    def open_call(self, name: str, call_id: str | None = None, arguments: str = "") -> int:
        """Start call number `calls`; whitespace around it is dropped from content."""
        self.content_sink.cut()
        index = self.calls
        self.calls += 1
        self.events.append(ToolCallDelta(index, call_id or self._id_factory(), name, arguments))
        return index

    def arguments(self, index: int, text: str) -> None:
        if text:
            self.events.append(ToolCallDelta(index, None, None, text))

    def end(self) -> None:
        """End of output: held trailing content whitespace survives only without calls."""
        held = self.content_sink.end(keep_held=self.calls == 0)
        if held:
            self.events.append(ContentDelta(held))

    def take(self) -> list[Event]:
        events, self.events = _merge(self.events), []
        return events


def _merge(events: list[Event]) -> list[Event]:
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


# --------------------------------------------------------------------------- JSON call reader

_HEADER_RE = re.compile(
    r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*', re.S
)


class _JsonCallReader:
    """Reads one ``{"name": ..., "arguments": {...}}`` object (also ``"parameters"``).

    When the object starts with the name followed by an object of arguments, the call is
    announced as soon as the arguments begin and they are streamed. Otherwise the object is
    held until it is complete and then read whole. `status` becomes "ended" (a call was
    emitted; `rest` is the input after it, possibly junk) or "failed" (no call; `raw` is the
    text consumed, `rest` what followed the failing character).
    """

    def __init__(self, out: _Out) -> None:
        self._out = out
        self._scanner = _JsonScanner(top="{")
        self._raw: list[str] = []
        self._prev_significant = ""
        self._streamer: _ArgsStreamer | None = None
        self._tail: _JsonScanner | None = None
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

    def finish(self) -> None:
        if self._tail is not None:
            self.status = "ended"
        elif self._streamer is not None:
            self._apply(self._streamer.finish())
        else:
            self.status = "failed"

    def _feed_header(self, text: str) -> None:
        for i, ch in enumerate(text):
            if ch not in _WS:
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
        self._streamer = _ArgsStreamer()
        return True

    def _read_whole(self) -> None:
        try:
            call = _call_from_object(json.loads(self.raw, strict=False))
        except ValueError:
            call = None
        if call is None:
            self.status = "failed"
            return
        name, arguments, _ = call
        self._out.open_call(name, None, arguments)
        self.status = "ended"

    def _feed_arguments(self, text: str) -> None:
        assert self._streamer is not None
        self._apply(self._streamer.feed(text))

    def _apply(self, step: _Step) -> None:
        self._out.arguments(self._index, step.fragment)
        if step.state == "done":
            self._tail = _JsonScanner.after_object_member()
            self._feed_tail(step.rest)
        elif step.state == "broken":
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


# --------------------------------------------------------------------------- XML call form

_XML_FUNCTION_RE = re.compile(r"\s*<function=([^>\n]+)>(.*?)</function>\s*", re.S)
_XML_PARAMETER_RE = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)


def _schema_allows_string(schema: Any) -> bool:
    if not isinstance(schema, dict):
        return False
    kind = schema.get("type")
    return kind == "string" or (isinstance(kind, list) and "string" in kind)


def _xml_value(raw: str, schema: Any) -> Any:
    """A parameter value: kept as text for string parameters, else JSON when it parses."""
    if _schema_allows_string(schema):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _parse_xml_call(body: str, param_schemas: dict[str, dict[str, Any]]) -> tuple[str, str] | None:
    """(name, arguments) from ``<function=NAME><parameter=K>V</parameter>...</function>``."""
    match = _XML_FUNCTION_RE.fullmatch(body)
    if match is None:
        return None
    name, inner = match.group(1).strip(), match.group(2)
    schemas = param_schemas.get(name, {})
    arguments: dict[str, Any] = {}
    position = 0
    for param in _XML_PARAMETER_RE.finditer(inner):
        if inner[position : param.start()].strip():
            return None
        position = param.end()
        value = param.group(2)
        value = value[1:] if value.startswith("\n") else value
        value = value[:-1] if value.endswith("\n") else value
        key = param.group(1).strip()
        arguments[key] = _xml_value(value, schemas.get(key))
    if inner[position:].strip() or not name:
        return None
    return name, dump_arguments(arguments)


def _parameter_schemas(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Tool name -> parameter name -> schema, from an OpenAI `tools` list."""
    result: dict[str, dict[str, Any]] = {}
    for tool in tools or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            continue
        parameters = function.get("parameters")
        properties = parameters.get("properties") if isinstance(parameters, dict) else None
        result[function["name"]] = properties if isinstance(properties, dict) else {}
    return result


# --------------------------------------------------------------------------- format layers


class _PlainLayer:
    """No tool calls: everything is content."""

    def __init__(self, out: _Out) -> None:
        self._out = out

    def feed(self, text: str) -> None:
        self._out.content(text)

    def finish(self) -> None:
        pass


class _HermesLayer:
    """``<tool_call>...</tool_call>`` blocks holding JSON or XML calls, anywhere in the text.

    A block is read as JSON when its first character is ``{`` and as the XML form when it
    starts with ``<function=``; anything else, or JSON that fails before the call is
    recognised, goes back to content as soon as that is certain.
    """

    _XML_START = "<function="

    def __init__(self, out: _Out, param_schemas: dict[str, dict[str, Any]]) -> None:
        self._out = out
        self._schemas = param_schemas
        self._buf = ""
        self._in_call = False
        self._reset_call()

    def _reset_call(self) -> None:
        self._kind: str | None = None  # None (undecided), "json", "xml" or "trailing"
        self._body: list[str] = []
        self._lead = ""
        self._reader: _JsonCallReader | None = None
        self._trailing: list[str] = []
        self._pushback = ""

    def feed(self, text: str) -> None:
        self._buf += text
        while True:
            marker = HERMES_CLOSE if self._in_call else HERMES_OPEN
            pos = self._buf.find(marker)
            cut = pos if pos >= 0 else len(self._buf) - _partial_suffix_len(self._buf, (marker,))
            ready, self._buf = self._buf[:cut], self._buf[cut:]
            was_in_call = self._in_call
            self._route(ready)
            if was_in_call and not self._in_call:  # the block turned out not to be a call
                self._buf = self._pushback + self._buf
                self._pushback = ""
                continue
            if pos < 0:
                return
            self._buf = self._buf[len(marker) :]
            if self._in_call:
                self._end_call(closed=True)
            else:
                self._in_call = True

    def finish(self) -> None:
        self.feed("")
        while self._buf or self._in_call:
            ready, self._buf = self._buf, ""
            was_in_call = self._in_call
            self._route(ready)
            if was_in_call and not self._in_call:
                self._buf, self._pushback = self._pushback, ""
                self.feed("")
                continue
            if self._in_call:
                self._end_call(closed=False)
            break

    def _route(self, text: str) -> None:
        if self._in_call:
            self._body_text(text)
        else:
            self._out.content(text)

    def _body_text(self, text: str) -> None:
        if not text:
            return
        self._body.append(text)
        if self._kind is None:
            self._lead += text
            start = self._lead.lstrip(_WS)
            if start.startswith("{"):
                self._kind = "json"
                self._reader = _JsonCallReader(self._out)
                self._feed_reader(start)
            elif start.startswith(self._XML_START):
                self._kind = "xml"
            elif not self._XML_START.startswith(start):
                # Give up at the first character that rules both forms out.
                same = next(i for i, (a, b) in enumerate(zip(start, self._XML_START)) if a != b)
                decided = len(self._lead) - len(start) + same + 1
                self._give_up(self._lead[:decided], self._lead[decided:])
        elif self._kind == "json":
            self._feed_reader(text)
        elif self._kind == "trailing":
            self._trailing.append(text)

    def _feed_reader(self, text: str) -> None:
        assert self._reader is not None
        self._reader.feed(text)
        self._after_reader()

    def _after_reader(self) -> None:
        assert self._reader is not None
        if self._reader.status == "ended":
            self._kind = "trailing"
            self._trailing.append(self._reader.rest)
        elif self._reader.status == "failed":
            lead = self._lead[: len(self._lead) - len(self._lead.lstrip(_WS))]
            self._give_up(lead + self._reader.raw, self._reader.rest)

    def _give_up(self, consumed: str, rest: str) -> None:
        """Not a call, as `consumed` shows: that goes to content, `rest` is read again."""
        self._out.content(HERMES_OPEN + consumed)
        self._in_call = False
        self._reset_call()
        self._pushback = rest

    def _not_a_call(self, closed: bool) -> None:
        """The whole block is no call: it goes to content verbatim, markers included."""
        self._out.content(HERMES_OPEN + "".join(self._body) + (HERMES_CLOSE if closed else ""))
        self._in_call = False
        self._reset_call()

    def _end_call(self, closed: bool) -> None:
        if self._kind == "json":
            assert self._reader is not None
            self._reader.finish()
            if self._reader.status == "failed":
                self._not_a_call(closed)
                return
            self._after_reader()
        if self._kind == "xml":
            call = _parse_xml_call("".join(self._body), self._schemas)
            if call is None:
                self._not_a_call(closed)
                return
            self._out.open_call(call[0], None, call[1])
        elif self._kind == "trailing":
            trailing = "".join(self._trailing)
            if not closed and HERMES_CLOSE.startswith(trailing.strip(_WS)):
                trailing = ""  # output cut inside the closing tag of a complete call
            self._out.content(trailing)
        else:
            self._not_a_call(closed)
            return
        self._in_call = False
        self._reset_call()


class _Llama3Layer:
    """A reply made of JSON call objects (optionally after ``<|python_tag|>``), else content."""

    def __init__(self, out: _Out) -> None:
        self._out = out
        self._state = "start"  # start, call, between, content
        self._buf = ""
        self._segment = ""  # text of the current call attempt before its object
        self._reader: _JsonCallReader | None = None

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
            rest = rest.lstrip(_WS + ";")
            rest = "" if PYTHON_TAG.startswith(rest.rstrip(_WS)) else rest
        self._out.content(rest)
        self._buf = ""

    def _start_or_between(self) -> bool:
        """Decide whether held text starts a call; False while undecided."""
        if self._state == "between":
            self._buf = self._buf.lstrip(_WS + ";")
        head = self._buf.lstrip(_WS)
        if head.startswith(PYTHON_TAG):
            head = head[len(PYTHON_TAG) :].lstrip(_WS)
        elif PYTHON_TAG.startswith(head):
            return False
        if not head:
            return False
        if head[0] == "{":
            self._segment = self._buf[: len(self._buf) - len(head)]
            self._buf = head
            self._state = "call"
            self._reader = _JsonCallReader(self._out)
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


_MISTRAL_NAME_RE = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_MISTRAL_ID_RE = re.compile(r"[A-Za-z0-9]{1,64}")
_NAME_CHAR_RE = re.compile(r"[A-Za-z0-9_.:-]")
_ID_CHAR_RE = re.compile(r"[A-Za-z0-9]")


class _MistralLayer:
    """``[TOOL_CALLS]`` followed by a JSON array of calls or by ``NAME[CALL_ID]ID[ARGS]{...}``."""

    def __init__(self, out: _Out, id_factory: Callable[[], str]) -> None:
        self._out = out
        self._id_factory = id_factory
        self._state = "content"  # content, start, array, name, call_id, args_wait, args
        self._buf = ""
        self._reset_call()

    def _reset_call(self) -> None:
        self._segment: list[str] = []
        self._scanner: _JsonScanner | None = None
        self._streamer: _ArgsStreamer | None = None
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
        if self._state == "args":
            assert self._streamer is not None
            self._end_arguments(self._streamer.finish())
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
            keep = _partial_suffix_len(self._buf, (MISTRAL_CALLS,))
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
        head = self._buf.lstrip(_WS)
        if not head:
            self._consume(len(self._buf))
            return False
        self._consume(len(self._buf) - len(head))
        if head[0] == "[":
            self._scanner = _JsonScanner(top="[")
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
        calls = _calls_from_json(value) if isinstance(value, list) else None
        if calls is None:
            return self._fail()
        for name, arguments, call_id in calls:
            self._out.open_call(name, _keepable_id(call_id), arguments)
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
                    return field.strip(_WS)
                if any(m.startswith(rest) for m in markers):
                    self._field += self._consume(i)
                    return None
            elif chars.fullmatch(ch) or (ch in _WS and not (self._field + self._buf[:i]).strip(_WS)):
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
        head = self._buf.lstrip(_WS)
        self._consume(len(self._buf) - len(head))
        if not head:
            return False
        if head[0] != "{":
            return self._fail()
        self._index = self._out.open_call(self._name, self._call_id)
        self._streamer = _ArgsStreamer()
        self._state = "args"
        return True

    def _in_args(self) -> bool:
        assert self._streamer is not None
        text, self._buf = self._buf, ""
        self._end_arguments(self._streamer.feed(text))
        return True

    def _end_arguments(self, step: _Step) -> None:
        self._out.arguments(self._index, step.fragment)
        if step.state != "open":
            self._buf = step.rest + self._buf
            self._reset_call()
            self._state = "content"


_FENCE = "```"


class _JsonLayer:
    """The whole reply (optionally in a ```json fence) is a call, a list of calls, or content."""

    def __init__(self, out: _Out) -> None:
        self._out = out
        self._state = "start"  # start, value, after, content
        self._buf = ""
        self._prefix = ""  # whitespace and fence before the value
        self._raw: list[str] = []  # the value so far
        self._fenced = False
        self._scanner: _JsonScanner | None = None

    def feed(self, text: str) -> None:
        self._buf += text
        while self._buf and getattr(self, "_in_" + self._state)():
            pass

    def finish(self) -> None:
        rest = self._buf
        if self._state == "value":
            rest = self._prefix + "".join(self._raw) + rest
        elif self._state == "after":
            rest = rest.strip(_WS)
            if self._fenced and _FENCE.startswith(rest):
                rest = ""
        self._out.content(rest)
        self._buf = ""

    def _in_content(self) -> bool:
        self._out.content(self._buf)
        self._buf = ""
        return False

    def _in_start(self) -> bool:
        head = self._buf.lstrip(_WS)
        fenced = head.startswith(_FENCE)
        if fenced:
            label = head[len(_FENCE) :]
            if "json".startswith(label):
                return False
            head = (label[4:] if label.startswith("json") else label).lstrip(_WS)
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
        self._scanner = _JsonScanner()
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
            calls = _calls_from_json(json.loads("".join(self._raw), strict=False))
        except ValueError:
            calls = None
        if calls is None:
            return self._give_up(rest)
        for name, arguments, call_id in calls:
            self._out.open_call(name, _keepable_id(call_id), arguments)
        self._raw = []
        self._buf = rest
        self._state = "after"
        return True

    def _in_after(self) -> bool:
        head = self._buf.lstrip(_WS)
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


# --------------------------------------------------------------------------- the parser


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
      tools: the request's OpenAI `tools`, used only to keep XML string parameters as text.

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
    ) -> None:
        if format not in FORMATS:
            raise ValueError(f"unknown tool call format {format!r}; expected one of {FORMATS}")
        self.format = format
        factory = id_factory or new_call_id
        parse_tools = tools_enabled and format != "none"
        self._out = _Out(factory, hold_ws=parse_tools)
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

    def _make_layer(self, format: str, factory: Callable[[], str], tools: list[dict[str, Any]] | None):
        if format in HERMES_FORMATS:
            return _HermesLayer(self._out, _parameter_schemas(tools))
        if format == "llama3":
            return _Llama3Layer(self._out)
        if format == "mistral":
            return _MistralLayer(self._out, factory)
        if format == "json":
            return _JsonLayer(self._out)
        return _PlainLayer(self._out)

    @property
    def in_reasoning(self) -> bool:
        """True while the output fed so far is inside reasoning (meant for gating a lazy grammar)."""
        return self._mode in ("opening", "reasoning")

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

    def finish(self) -> list[Event]:
        """End of output: flush everything held back. Unfinished calls become content."""
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
        self._layer.finish()
        self._out.end()
        return self._out.take()

    def parse_complete(self, text: str) -> ParsedMessage:
        """Parse a whole output at once; identical to streaming it and aggregating."""
        return collect(self.feed(text) + self.finish())

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
        head = self._buf.lstrip(_WS)
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
        pos, marker = _find_first(self._buf, self._reasoning_ends)
        if pos < 0:
            keep = _partial_suffix_len(self._buf, self._reasoning_ends)
            self._out.reasoning(self._buf[: len(self._buf) - keep])
            self._buf = self._buf[len(self._buf) - keep :]
            return
        self._out.reasoning(self._buf[:pos])
        self._out.end_reasoning()
        rest = self._buf[pos + len(marker) :] if marker == THINK_CLOSE else self._buf[pos:]
        self._buf = ""
        self._mode = "content"
        self._layer.feed(rest)


# --------------------------------------------------------------------------- detection

_GENERATION_PROMPT_RE = re.compile(r"add_generation_prompt")
_STRING_LITERAL_RE = re.compile(r"'((?:[^'\\]|\\.)*)'|\"((?:[^\"\\]|\\.)*)\"", re.S)


def detect_format(chat_template: str | None, arch: str) -> str:
    """Pick the tool-call format a model most likely produces.

    Decided from the chat template source when it shows a tool syntax:
      ``<tool_call>`` with ``<function=``/``<parameter=`` -> "hermes_xml" (Qwen3-Coder, Qwen3.5);
      ``<tool_call>`` -> "hermes"; ``[TOOL_CALLS]`` -> "mistral";
      ``<|python_tag|>``, or an ``ipython`` role with ``"parameters"`` -> "llama3".
    Otherwise "hermes", whatever `arch` says: the Qwen families (qwen2, qwen3, qwen3moe,
    qwen35, ...) use Hermes markers natively, and templates that know no tools get a
    Hermes-style tool prompt injected by the server, so Hermes is what such models are asked
    to write. `arch` thus never changes the answer today; it is taken so that a caller without
    a template needs no special case.
    """
    template = chat_template or ""
    if HERMES_OPEN in template:
        if "<function=" in template and "<parameter=" in template:
            return "hermes_xml"
        return "hermes"
    if MISTRAL_CALLS in template:
        return "mistral"
    if PYTHON_TAG in template or ("ipython" in template and '"parameters"' in template):
        return "llama3"
    return "hermes"


def prompt_opens_reasoning(prompt: str) -> bool:
    """Whether a rendered prompt ends inside a think block (its last ``<think>`` is unclosed)."""
    start = prompt.rfind(THINK_OPEN)
    return start >= 0 and THINK_CLOSE not in prompt[start:]


def detect_reasoning(chat_template: str | None, arch: str) -> tuple[bool, bool]:
    """(uses ``<think>`` reasoning, generation prompt leaves a think block open).

    Heuristics: the template mentions ``<think>`` -> reasoning. The generation prompt is taken
    to be the template text after its last mention of ``add_generation_prompt``; if one of the
    string literals there contains ``<think>`` not followed by ``</think>`` in the same literal
    (``'<|im_start|>assistant\\n<think>\\n'``), the output starts inside reasoning. A literal
    such as ``'<think>\\n\\n</think>\\n\\n'`` (thinking switched off) does not count. `arch` is
    not needed by these rules. Which branch a template takes depends on its variables
    (``enable_thinking`` and the like), so this is a default; `prompt_opens_reasoning` on the
    rendered prompt gives the answer for one request.
    """
    template = chat_template or ""
    if THINK_OPEN not in template:
        return False, False
    positions = [m.end() for m in _GENERATION_PROMPT_RE.finditer(template)]
    tail = template[positions[-1] :] if positions else ""
    opens = False
    for match in _STRING_LITERAL_RE.finditer(tail):
        literal = match.group(1) if match.group(1) is not None else match.group(2)
        pos = literal.find(THINK_OPEN)
        if pos >= 0 and THINK_CLOSE not in literal[pos:]:
            opens = True
            break
    return True, opens
