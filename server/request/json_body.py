"""A request body's JSON: parsed, refused when it is not a JSON object or nests too deeply,
and its lone UTF-16 surrogates replaced."""

from __future__ import annotations

import json
import re
from typing import Any

from ..errors import InvalidRequest

MAX_DEPTH = 100  # nesting of a request body; templates and schema tools recurse over it
_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def parse_body(raw: bytes) -> dict:
    """The JSON object of a request body (see `parse_json`)."""
    body = parse_json(raw, "a JSON object")
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    return body


def parse_json(raw: bytes, wanted: str) -> Any:
    """The JSON value of a request body (`wanted` names what the route takes, for the error
    of an empty one). Lone UTF-16 surrogates (`"\\ud800"`), which no UTF-8 text can hold,
    become U+FFFD, as other servers do; NaN and Infinity are refused."""
    if not raw:
        raise InvalidRequest(f"the request body is empty; send {wanted}")
    try:
        body = json.loads(raw, parse_constant=_no_constant)
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidRequest("the request body is nested too deeply") from None
    if _depth(body) > MAX_DEPTH:
        raise InvalidRequest(f"the request body is nested more than {MAX_DEPTH} levels deep")
    if _ESCAPED_SURROGATE.search(raw):
        body = _replace_lone_surrogates(body)
    return body


def _depth(value: Any) -> int:
    """How deeply arrays and objects nest in `value` (iterative)."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in item if isinstance(child, (list, dict)))
    return deepest


def _replace_lone_surrogates(value: Any) -> Any:
    """The value with every lone surrogate in its strings (keys too) replaced by U+FFFD.
    Iterative, so no nesting depth can overflow the stack."""
    def clean(text: str) -> str:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")

    root = [value]
    stack: list[tuple[Any, Any]] = [(root, 0)]
    while stack:
        container, key = stack.pop()
        item = container[key]
        if isinstance(item, str):
            container[key] = clean(item)
        elif isinstance(item, list):
            stack.extend((item, i) for i in range(len(item)))
        elif isinstance(item, dict):
            cleaned = {clean(k): v for k, v in item.items()}
            container[key] = cleaned
            stack.extend((cleaned, k) for k in cleaned)
    return root[0]
