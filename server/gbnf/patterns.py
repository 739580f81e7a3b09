"""The ``pattern`` keyword: regexes made portable to the converter, or dropped.

The converter turns a regex into GBNF itself, and llama.cpp rejects some of what it writes
(escapes it does not know). A pattern that gives no valid grammar is dropped, leaving that
string unconstrained, rather than failing the request. So is a pattern whose grammar would
make sampling explode (`repetition_problem`): llama.cpp follows every way a grammar can match
the empty string, one by one, so a repeated group that can be empty and is nested in another
repetition takes exponential time on the first character (``((a{0,30}){0,30}){0,30}`` never
finishes), and nested counted repetitions keep a parse state for every combination of counts.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from warmslot.slots import GrammarSpec, check_grammar

from .converter import schema_to_gbnf
from .limits import DATA_KEYWORDS, MAX_COUNT

# Combinations of counts of nested variable repetitions (``(a{1,2}){0,300}``: 600): each is a
# parse state llama.cpp may keep, and checks every candidate token against, on every step.
MAX_PATTERN_COUNTERS = 1_000


@functools.lru_cache(maxsize=256)
def usable_pattern(pattern: str) -> str | None:
    """`pattern` in a form the converter turns into valid GBNF, or None if there is none."""
    if repetition_problem(pattern) is not None:
        return None
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


@dataclass(slots=True)
class _Group:
    """A parenthesized part of a regex (or the whole of it): alternatives of quantified items."""

    alternatives: list[list[_Item]] = field(default_factory=lambda: [[]])

    @property
    def nullable(self) -> bool:
        return any(all(item.nullable for item in sequence) for sequence in self.alternatives)

    @property
    def counters(self) -> int:
        return max((item.counters for sequence in self.alternatives for item in sequence), default=1)


@dataclass(slots=True)
class _Item:
    """One atom (a character, class, escape or group) and its quantifier."""

    atom: _Group | None  # None: a single character
    low: int = 1
    high: int | None = 1  # None: unbounded
    empty: bool = False  # a zero-width assertion (^, $, \b)

    @property
    def nullable(self) -> bool:
        return self.low == 0 or self.empty or (self.atom is not None and self.atom.nullable)

    @property
    def counters(self) -> int:
        inner = self.atom.counters if self.atom is not None else 1
        varies = self.high is not None and self.high > 1 and self.high != self.low
        return inner * (self.high if varies else 1)


_QUANTIFIER_RE = re.compile(r"\*|\+|\?|\{(\d+)(,(\d*))?\}")
_ZERO_WIDTH = frozenset(("^", "$", "\\b", "\\B"))


def repetition_problem(pattern: str) -> str | None:
    """Why `pattern`'s repetitions would make a grammar too costly to sample, or None."""
    stack = [_Group()]
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        quantifier = _QUANTIFIER_RE.match(pattern, i)
        if quantifier is not None and stack[-1].alternatives[-1]:
            problem = _quantify(stack[-1].alternatives[-1][-1], quantifier)
            if problem is not None:
                return problem
            i = quantifier.end() + (pattern.startswith("?", quantifier.end()) and quantifier.group(0) != "?")
            continue
        if ch == "(":
            stack.append(_Group())
            i += 2 if pattern.startswith("?:", i + 1) else 1
            continue
        if ch == ")" and len(stack) > 1:
            group = stack.pop()
            stack[-1].alternatives[-1].append(_Item(group))
        elif ch == "|":
            stack[-1].alternatives.append([])
        else:
            size = _atom_size(pattern, i)
            atom = pattern[i : i + size]
            stack[-1].alternatives[-1].append(_Item(None, empty=atom in _ZERO_WIDTH))
            i += size
            continue
        i += 1
    counters = stack[0].counters
    if counters > MAX_PATTERN_COUNTERS:
        return f"nested repetitions allow {counters} combinations of counts"
    return None


def _quantify(item: _Item, quantifier: re.Match[str]) -> str | None:
    """Apply a quantifier to the last item; say what is wrong with the result."""
    text = quantifier.group(0)
    if text in ("*", "+", "?"):
        item.low, item.high = (0 if text != "+" else 1), (1 if text == "?" else None)
    else:
        item.low = int(quantifier.group(1))
        item.high = item.low if quantifier.group(2) is None else (int(quantifier.group(3)) if quantifier.group(3) else None)
        if max(item.low, item.high or 0) > MAX_COUNT:
            return f"a repetition count above {MAX_COUNT}"
    repeats = item.high is None or item.high > 1
    if repeats and item.atom is not None and item.atom.nullable:
        return "a repeated group that can match the empty string"
    return None


def _atom_size(pattern: str, i: int) -> int:
    """Length of the atom at `i`: an escape, a character class, or one character."""
    if pattern[i] == "\\":
        return 2
    if pattern[i] != "[":
        return 1
    j = i + 1
    if pattern.startswith("^", j):
        j += 1
    if pattern.startswith("]", j):
        j += 1
    while j < len(pattern) and pattern[j] != "]":
        j += 2 if pattern[j] == "\\" else 1
    return j + 1 - i
