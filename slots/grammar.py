"""The grammar a request carries for constrained sampling.

A `GrammarSpec` holds GBNF text and, for a lazy grammar, what starts it. Triggers are given as
regex patterns and as texts; the sampler (`llama_api.Sampler`) turns each trigger text that is
exactly one token of the model's vocabulary into a trigger token, so the producer of a grammar
needs no vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
    """llama.cpp rejected a grammar."""
