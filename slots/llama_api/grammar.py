"""Grammars for constrained sampling, and the limits that keep llama.cpp's grammar code safe.

A `GrammarSpec` is what a request carries: GBNF text and, for a lazy grammar, what starts it.
Triggers are given as regex patterns and as texts; the sampler (`llama_api.Sampler`) turns
each trigger text that is exactly one token of the model's vocabulary into a trigger token,
so the producer of a grammar needs no vocabulary.

llama.cpp compiles GBNF with no bound on the work. Its parser recurses once per level of
parentheses, and overflows its stack (a segfault) from about 20,000 levels on 8 MiB thread
stacks. It expands a repetition ``x{m,n}`` into m copies of ``x`` and n - m rules. And it
compares every parse stack it starts with all the others, so the alternatives that can start
at one point cost quadratic time. `shape_error` measures a grammar's text before llama.cpp
sees it and refuses what lies beyond the limits below. Measured on 2 CPU cores, idle (about
three times slower while other work runs), the limits compile in a few tenths of a second.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field

# The whole GBNF text. Tool sets of dozens of functions give grammars of tens of KB; 540 KB
# of 20,000 simple rules compile in 0.01 s.
MAX_GRAMMAR_BYTES = 1 << 20
# Rules written in the text (llama.cpp adds its own for groups and repetitions).
MAX_GRAMMAR_RULES = 20_000
# Levels of parentheses: 20 times fewer than overflow llama.cpp's parser.
MAX_GRAMMAR_NESTING = 1_000
# Units of counted repetition, summed over the grammar: ``x{m,n}`` costs max(m, n) of them.
# 200,000 compile in 0.05 s and 22 MB, 400,000 in 0.11 s and 46 MB, 2,000,000 in 0.57 s and
# 236 MB, 20,000,000 in 10 s and 2.4 GB.
MAX_GRAMMAR_REPETITIONS = 500_000
# Alternatives (``|``) in the grammar: 10,000 alternatives of one rule compile in 0.11 s,
# 20,000 in 0.45 s, 60,000 in 4.3 s.
MAX_GRAMMAR_ALTERNATIVES = 10_000

# Literals, character classes and comments: their contents are not grammar structure.
_OPAQUE_RE = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|#[^\n]*', re.S)
_COUNT_RE = re.compile(r"\{\s*(\d+)\s*(?:(,)\s*(\d*)\s*)?\}")


@dataclass(slots=True)
class GrammarSpec:
    """A GBNF grammar for the sampler; a lazy one constrains nothing until a trigger fires.

    A trigger pattern (std::regex, ECMAScript) matched against all text generated so far
    starts the grammar at its first capture group; a trigger text starts it when sampled as a
    single token, and is then the grammar's first input.
    """

    grammar: str
    root: str = "root"
    lazy: bool = False
    trigger_patterns: list[str] = field(default_factory=list)
    trigger_texts: list[str] = field(default_factory=list)


class GrammarError(ValueError):
    """llama.cpp rejected a grammar, or the grammar is beyond what it compiles safely."""


@dataclass(slots=True)
class GrammarShape:
    """What decides llama.cpp's cost of compiling a grammar."""

    size: int  # bytes of text
    rules: int
    nesting: int  # deepest level of parentheses
    repetitions: int  # units of counted repetition
    alternatives: int


def measure(text: str) -> GrammarShape:
    """The shape of a GBNF text (a linear scan; no parsing)."""
    structure = _OPAQUE_RE.sub(" ", text)
    steps = (1 if ch == "(" else -1 for ch in re.findall(r"[()]", structure))
    nesting = max(itertools.accumulate(steps, initial=0))
    repetitions = 0
    for low, comma, high in _COUNT_RE.findall(structure):
        repetitions += max(int(low), int(high) if high else 0) if comma else int(low)
    return GrammarShape(len(text.encode("utf-8")), structure.count("::="), nesting, repetitions, structure.count("|"))


def shape_error(text: str) -> str | None:
    """Why `text` is beyond the limits above, or None when llama.cpp may compile it."""
    shape = measure(text)
    if shape.size > MAX_GRAMMAR_BYTES:
        return f"the grammar has {shape.size} bytes; the limit is {MAX_GRAMMAR_BYTES}"
    if shape.rules > MAX_GRAMMAR_RULES:
        return f"the grammar has {shape.rules} rules; the limit is {MAX_GRAMMAR_RULES}"
    if shape.nesting > MAX_GRAMMAR_NESTING:
        return f"the grammar nests {shape.nesting} groups deep; the limit is {MAX_GRAMMAR_NESTING}"
    if shape.repetitions > MAX_GRAMMAR_REPETITIONS:
        return f"the grammar's repetitions add up to {shape.repetitions}; the limit is {MAX_GRAMMAR_REPETITIONS}"
    if shape.alternatives > MAX_GRAMMAR_ALTERNATIVES:
        return f"the grammar has {shape.alternatives} alternatives; the limit is {MAX_GRAMMAR_ALTERNATIVES}"
    return None
