"""The ``pattern`` keyword: regexes made portable to the converter, or dropped.

The converter turns a regex into GBNF itself, and llama.cpp rejects some of what it writes
(escapes it does not know). A pattern that gives no valid grammar is dropped, leaving that
string unconstrained, rather than failing the request.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from warmslot.slots import GrammarSpec, check_grammar

from .converter import schema_to_gbnf

# Keywords whose values are JSON data, not schemas.
DATA_KEYWORDS = frozenset(("const", "enum", "default", "examples"))


@functools.lru_cache(maxsize=256)
def usable_pattern(pattern: str) -> str | None:
    """`pattern` in a form the converter turns into valid GBNF, or None if there is none."""
    portable = _portable_pattern(pattern)
    try:
        text = schema_to_gbnf({"type": "string", "pattern": portable})
    except Exception:  # unsupported regex syntax
        return None
    return portable if check_grammar(None, GrammarSpec(text)) is None else None


_PATTERN_CLASSES = {"d": "0-9", "w": "a-zA-Z0-9_", "s": " \\t\\n\\r"}


def _portable_pattern(pattern: str) -> str:
    """`pattern` with the ``\\d \\w \\s`` shorthands written as explicit character classes."""
    out: list[str] = []
    in_class = False
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            shorthand = _PATTERN_CLASSES.get(pattern[i + 1])
            if shorthand is None:
                out.append(pattern[i : i + 2])
            else:
                out.append(shorthand if in_class else f"[{shorthand}]")
            i += 2
            continue
        if ch == "[" and not in_class:
            in_class = True
        elif ch == "]" and in_class:
            in_class = False
        out.append(ch)
        i += 1
    return "".join(out)


def with_patterns(schema: Any, rewrite: Callable[[str], str | None]) -> Any:
    """A copy of `schema` with every string ``pattern`` rewritten (dropped where that gives None)."""
    if isinstance(schema, list):
        return [with_patterns(item, rewrite) for item in schema]
    if not isinstance(schema, dict):
        return schema
    copy = {}
    for key, value in schema.items():
        if key in DATA_KEYWORDS:
            copy[key] = value
        elif key == "pattern" and isinstance(value, str):
            usable = rewrite(value)
            if usable is not None:
                copy[key] = usable
        else:
            copy[key] = with_patterns(value, rewrite)
    return copy

