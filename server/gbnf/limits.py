"""Bounds on JSON schemas, so that their grammars compile in bounded time and memory.

A schema is turned into GBNF text that llama.cpp then compiles, and both steps grow with
numbers inside the schema rather than with its size: ``maxLength: N`` becomes about 2N units
of counted repetition, which llama.cpp expands one rule per unit (see `warmslot.slots.llama_api.grammar`),
and an exact numeric range grows with its bounds' digits. Measured on 2 idle CPU cores,
compiling a string of ``maxLength`` 10^5 takes 0.05 s and 22 MB, 10^6 takes 0.6 s and 240 MB,
10^7 takes 10 s and 2.4 GB, and 10^8 overflows the stack of llama.cpp's parser: a segfault.

`check_schema_limits` walks a schema before it is converted and answers 400 naming the first
keyword beyond these limits. A larger bound is not rewritten into an unbounded one: that
would accept values the schema forbids.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from ..errors import InvalidRequest
from .numbers import bound_value

# One minLength, maxLength, minItems or maxItems: compiles in 0.05 s and 22 MB.
MAX_COUNT = 100_000
# All of them in one schema together (0.11 s and 46 MB), within the grammar's limit.
MAX_TOTAL_COUNT = 200_000
# Schemas inside schemas (properties, items, anyOf, $defs, ...). Real schemas stay under 10.
MAX_SCHEMA_DEPTH = 32
# Properties of one object: the converter's rule for optional properties takes cubic time
# (0.23 s at 500 properties, 1.5 s at 900 on a busy machine).
MAX_OBJECT_PROPERTIES = 500
# Digits of a numeric bound written out without exponent, and its significant digits. Every
# finite double fits (309 integer digits at most, 325 for the smallest subnormal, 17
# significant), as does every 128-bit integer (39).
MAX_BOUND_DIGITS = 330
MAX_BOUND_SIGNIFICANT_DIGITS = 40
# Subschemas the converter may visit for one schema: a type list or an ``allOf`` of references
# visits a subschema once per use, which multiplies with every level.
MAX_SCHEMA_VISITS = 20_000

# Where a schema leaves a string's length or an array's item count open, the grammar stops
# there (a plain string or array, or one with only a minimum), so sampling cannot run away.
OPEN_STRING_CHARS = 100_000
OPEN_ARRAY_ITEMS = 10_000

COUNT_KEYWORDS = ("minLength", "maxLength", "minItems", "maxItems")
BOUND_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
# Keywords whose values are JSON data, not schemas.
DATA_KEYWORDS = frozenset(("const", "enum", "default", "examples"))
# Keywords whose values map names to schemas.
MAP_KEYWORDS = frozenset(("properties", "patternProperties", "$defs", "definitions", "dependentSchemas"))


class SchemaTooLarge(ValueError):
    """The converter would do more work for a schema than `MAX_SCHEMA_VISITS` allows."""


def check_schema_limits(schema: Any, param: str) -> None:
    """Raise InvalidRequest, with `param` extended to the offending keyword, when `schema`
    is beyond the limits above."""
    _SchemaWalk().node(schema, param, 0)


def count(schema: dict[str, Any], key: str) -> int | None:
    """A length or item count keyword as an int; None when absent or not a count."""
    value = schema.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not value.is_integer():
        return None
    return int(value) if value >= 0 else None


class _SchemaWalk:
    """One pass over a schema, summing its counts on the way."""

    def __init__(self) -> None:
        self.total = 0

    def node(self, node: Any, at: str, depth: int) -> None:
        if isinstance(node, list):
            for i, item in enumerate(node):
                self.node(item, f"{at}[{i}]", depth)
            return
        if not isinstance(node, dict):
            return
        if depth > MAX_SCHEMA_DEPTH:
            raise InvalidRequest(f"the schema nests more than {MAX_SCHEMA_DEPTH} levels deep", param=at)
        self._counts(node, at)
        if _is_numeric(node):
            for key in BOUND_KEYWORDS:
                _check_bound(node, key, f"{at}.{key}")
        for key, value in node.items():
            if key in DATA_KEYWORDS:
                continue
            if key in MAP_KEYWORDS and isinstance(value, dict):
                self._named(value, f"{at}.{key}", depth, limit=key == "properties")
            else:
                self.node(value, f"{at}.{key}", depth + 1)

    def _named(self, schemas: dict[str, Any], at: str, depth: int, limit: bool) -> None:
        if limit and len(schemas) > MAX_OBJECT_PROPERTIES:
            raise InvalidRequest(
                f"an object schema has {len(schemas)} properties; at most {MAX_OBJECT_PROPERTIES} are supported", param=at
            )
        for name, schema in schemas.items():
            self.node(schema, f"{at}.{name}", depth + 1)

    def _counts(self, node: dict[str, Any], at: str) -> None:
        for key in COUNT_KEYWORDS:
            value = count(node, key)
            if value is not None and value > MAX_COUNT:
                raise InvalidRequest(f"'{key}' is {value}; at most {MAX_COUNT} is supported", param=f"{at}.{key}")
        for low, high in (("minLength", "maxLength"), ("minItems", "maxItems")):
            self.total += max(count(node, low) or 0, count(node, high) or 0)
            if self.total > MAX_TOTAL_COUNT:
                raise InvalidRequest(
                    f"the schema's lengths and item counts add up to more than {MAX_TOTAL_COUNT}",
                    param=f"{at}.{high if high in node else low}",
                )


def _is_numeric(node: dict[str, Any]) -> bool:
    """Whether the converter writes exact ranges for this schema (bounds of other types are ignored)."""
    kind = node.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    return "integer" in kinds or "number" in kinds


def _check_bound(node: dict[str, Any], key: str, at: str) -> None:
    value = bound_value(node.get(key))
    if value is None:
        return
    digits = _digits(value)
    significant = digits.strip("0")
    if len(digits) > MAX_BOUND_DIGITS or len(significant) > MAX_BOUND_SIGNIFICANT_DIGITS:
        raise InvalidRequest(
            f"'{key}' has {len(digits)} digits ({len(significant)} significant); at most {MAX_BOUND_DIGITS} "
            f"({MAX_BOUND_SIGNIFICANT_DIGITS} significant) are supported",
            param=at,
        )


def _digits(value: Decimal) -> str:
    """The digits of a decimal written without exponent, leading zeros of the integer part
    and trailing zeros of the fraction dropped."""
    whole, _, fraction = format(value.copy_abs(), "f").partition(".")
    return whole.lstrip("0") + fraction.rstrip("0")
