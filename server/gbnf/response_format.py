"""The grammar for a `response_format` schema: JSON values of it, after an optional think block."""

from __future__ import annotations

from typing import Any

from warmslot.slots import GrammarSpec, check_grammar

from ..errors import InvalidRequest
from .rules import GrammarRules, with_reasoning


def json_schema_grammar(
    schema: dict[str, Any], param: str, *, reasoning: bool = False, starts_in_reasoning: bool = False
) -> GrammarSpec:
    """A grammar for one JSON value of `schema` (`param` names it in errors). A think block
    may precede the JSON when the model reasons (see `tools.tool_call_grammar`)."""
    grammar = GrammarRules()
    value = grammar.schema(schema, "rf", param)
    grammar.add("root", with_reasoning(grammar, value, reasoning, starts_in_reasoning))
    spec = GrammarSpec(grammar.text())
    error = check_grammar(None, spec)
    if error is not None:
        raise InvalidRequest(f"the JSON schema gives a grammar that cannot be used: {error}", param=param)
    return spec
