"""A grammar under construction: named rules, JSON-schema rules under a prefix, and the few
rule shapes that tool-call and response grammars share."""

from __future__ import annotations

from typing import Any

from ..output.markers import THINK_CLOSE, THINK_OPEN
from .schema import convert_schema
from .text import char_class, gbnf_literal, rename


class GrammarRules:
    """Rules collected for one grammar, written with ``root`` first."""

    def __init__(self) -> None:
        self.rules: dict[str, str] = {}

    def add(self, name: str, body: str) -> str:
        self.rules[name] = body
        return name

    def schema(self, schema: dict[str, Any], prefix: str, param: str) -> str:
        """Add the rules for JSON values matching `schema`; answers their start rule."""
        rules = convert_schema(schema, param)
        mapping = {name: f"{prefix}-{name}" for name in rules}
        for name, body in rules.items():
            self.rules[mapping[name]] = rename(body, mapping)
        return mapping["root"]

    def until(self, prefix: str, delimiter: str) -> str:
        """Add rules for any text up to and including the first `delimiter`.

        A right-linear grammar of the delimiter's matching automaton (KMP): rule ``prefix-k``
        means "the last k characters are the delimiter's first k", so the delimiter can only
        occur at the very end.
        """
        if f"{prefix}-0" in self.rules:
            return f"{prefix}-0"
        size = len(delimiter)
        chars = sorted(set(delimiter))
        for state in range(size):
            targets: dict[int, list[str]] = {}
            for ch in chars:
                targets.setdefault(_kmp_step(delimiter, state, ch), []).append(ch)
            moving = [ch for target, group in targets.items() if target for ch in group]
            alternatives = [f"{char_class(moving, negated=True)} {prefix}-0"]
            for target, group in sorted(targets.items()):
                if not target:
                    continue
                match = gbnf_literal(group[0]) if len(group) == 1 else char_class(group)
                alternatives.append(match if target == size else f"{match} {prefix}-{target}")
            self.add(f"{prefix}-{state}", " | ".join(alternatives))
        return f"{prefix}-0"

    def text(self) -> str:
        names = ["root"] + [name for name in self.rules if name != "root"]
        return "".join(f"{name} ::= {self.rules[name]}\n" for name in names)


def _kmp_step(delimiter: str, state: int, ch: str) -> int:
    """Length of the longest start of `delimiter` that ends the text seen plus `ch`."""
    seen = delimiter[:state] + ch
    for size in range(min(len(seen), len(delimiter)), 0, -1):
        if delimiter.startswith(seen[-size:]):
            return size
    return 0


def with_reasoning(grammar: GrammarRules, body: str, reasoning: bool, starts_in_reasoning: bool) -> str:
    """Let a think block precede `body`: required when the prompt opened one, else optional."""
    if not (reasoning or starts_in_reasoning):
        return body
    gap = grammar.add("think-gap", r"[ \n]{0,4}")
    think = f"{grammar.until('think', THINK_CLOSE)} {gap}"
    if starts_in_reasoning:
        return f"{think} {body}"
    return f"({gbnf_literal(THINK_OPEN)} {think})? {body}"
