"""One JSON schema as grammar rules: bounded, converted, and checked by llama.cpp."""

from __future__ import annotations

from typing import Any

from warmslot.slots import GrammarSpec, check_grammar

from ..errors import InvalidRequest
from .converter import schema_to_gbnf
from .limits import SchemaTooLarge, check_schema_limits
from .patterns import usable_pattern, with_patterns
from .text import split_rules


def convert_schema(schema: dict[str, Any], param: str) -> dict[str, str]:
    """The rules for values of `schema` (``root`` first); a schema that cannot be used is the
    client's error, named by `param`.

    The schema is checked against the limits of `limits` first, so no large repetition or
    range is ever written out. The converter copies regex escapes of ``pattern`` into GBNF
    verbatim, so ``\\d``, ``\\w`` and ``\\s`` are spelled out as character classes first; a
    pattern that still cannot be converted is dropped (that string is then unconstrained)
    rather than failing the request.
    """
    check_schema_limits(schema, param)
    try:
        text = schema_to_gbnf(with_patterns(schema, usable_pattern))
    except SchemaTooLarge as exc:
        raise InvalidRequest(str(exc), param=param) from None
    except Exception as exc:  # the converter raises assorted errors for schemas it rejects
        raise InvalidRequest(f"unsupported JSON schema: {exc}", param=param) from None
    error = check_grammar(None, GrammarSpec(text))
    if error is not None:
        raise InvalidRequest(f"the JSON schema gives a grammar that cannot be used: {error}", param=param)
    return split_rules(text)
