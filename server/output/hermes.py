"""The Hermes format: ``<tool_call>`` blocks holding a JSON call or the XML call form.

``hermes_xml`` (Qwen3-Coder, Qwen3.5) parses the same way; it differs only in the grammar.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .parsed import dump_arguments
from .json_calls import JsonCallReader
from .markers import HERMES_CLOSE, HERMES_OPEN, WHITESPACE, partial_marker_len
from .sink import EventSink


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


def parameter_schemas(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
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


class HermesLayer:
    """``<tool_call>...</tool_call>`` blocks holding JSON or XML calls, anywhere in the text.

    A block is read as JSON when its first character is ``{`` and as the XML form when it
    starts with ``<function=``; anything else, or JSON that fails before the call is
    recognised, goes back to content as soon as that is certain.
    """

    _XML_START = "<function="

    def __init__(self, out: EventSink, param_schemas: dict[str, dict[str, Any]]) -> None:
        self._out = out
        self._schemas = param_schemas
        self._buf = ""
        self._in_call = False
        self._reset_call()

    def _reset_call(self) -> None:
        self._kind: str | None = None  # None (undecided), "json", "xml" or "trailing"
        self._body: list[str] = []
        self._lead = ""
        self._reader: JsonCallReader | None = None
        self._trailing: list[str] = []
        self._pushback = ""

    def feed(self, text: str) -> None:
        self._buf += text
        while True:
            marker = HERMES_CLOSE if self._in_call else HERMES_OPEN
            pos = self._buf.find(marker)
            cut = pos if pos >= 0 else len(self._buf) - partial_marker_len(self._buf, (marker,))
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
            start = self._lead.lstrip(WHITESPACE)
            if start.startswith("{"):
                self._kind = "json"
                self._reader = JsonCallReader(self._out)
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
            lead = self._lead[: len(self._lead) - len(self._lead.lstrip(WHITESPACE))]
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
            self._reader.finish(at_end=not closed)
            if self._reader.status == "failed":
                self._not_a_call(closed)
                return
            self._after_reader()
        if self._kind == "xml":
            call = _parse_xml_call("".join(self._body), self._schemas)
            if call is None or not self._out.valid(*call):
                self._not_a_call(closed)
                return
            self._out.whole_call(call[0], None, call[1])
        elif self._kind == "trailing":
            trailing = "".join(self._trailing)
            if not closed and HERMES_CLOSE.startswith(trailing.strip(WHITESPACE)):
                trailing = ""  # output cut inside the closing tag of a complete call
            self._out.content(trailing)
        else:
            self._not_a_call(closed)
            return
        self._in_call = False
        self._reset_call()
