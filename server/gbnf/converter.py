"""JSON schema to GBNF: llama-cpp-python's converter, with the keywords it drops enforced."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from warmslot.slots import PRIMITIVE_RULES, RESERVED_NAMES, STRING_FORMAT_RULES, SchemaConverter

from .limits import MAX_SCHEMA_VISITS, OPEN_ARRAY_ITEMS, OPEN_STRING_CHARS, SchemaTooLarge, count
from .numbers import integer_range, number_range, numeric_bounds
from .text import gbnf_literal



# keywords that describe a value without constraining it
ANNOTATIONS = frozenset({"description", "title", "examples", "default", "$comment", "deprecated", "readOnly", "writeOnly", "$schema", "$id"})

class _SchemaConverter(SchemaConverter):
    """llama-cpp-python's converter, with the keywords it drops enforced.

    - Every string literal is escaped fully: the library version escapes only quotes and line
      breaks, so a ``const``, ``enum`` value or property name holding a backslash (or a quote
      after JSON encoding) breaks the grammar.
    - ``minimum``, ``maximum``, ``exclusiveMinimum`` and ``exclusiveMaximum`` bound integers
      exactly (`integer_range`) and numbers soundly (`number_range`: bounded numbers are
      written without exponent; every value the grammar allows is in range).
    - A list of types keeps the schema's other keywords in each alternative (the library
      turns ``{"type": ["integer", "null"], "maximum": 9}`` into any integer or null), and an
      ``enum``/``const`` next to a list of types decides alone, as it does next to one type.
    - ``minLength``/``maxLength`` and ``minItems``/``maxItems`` are written as counted
      repetitions (`_counted`), which llama.cpp accepts for any count; the library's nested
      optionals exceed llama.cpp's repetition limit from about 2000 on. ``minItems``/``maxItems``
      also apply to arrays without ``items``.
    - A string or array whose schema leaves its length open stops at `OPEN_STRING_CHARS`
      characters or `OPEN_ARRAY_ITEMS` items (or its minimum, if larger), untyped values
      included, so that sampling cannot run away (`_capped` keeps such a rule small).
    - Visits are counted: past `MAX_SCHEMA_VISITS` the conversion stops (`SchemaTooLarge`),
      since a type list or an ``allOf`` of references visits a subschema once per use, which
      multiplies with every level. A type named twice in a list is visited once.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.visits = 0

    def _format_literal(self, literal: str) -> str:
        return gbnf_literal(literal)

    def _add_primitive(self, name: str, rule: Any) -> str:
        # the rule goes in before its dependencies: "value" refers back to "array"
        if rule is PRIMITIVE_RULES["string"]:  # also under another name (a root string)
            added = self._add_rule(name, f'"\\"" {_capped("char", 0, OPEN_STRING_CHARS)} "\\"" space')
            dependency = "char"
        elif rule is PRIMITIVE_RULES["array"]:
            # a repeated group must be a rule of its own: llama.cpp refuses the inline one here
            more = _capped(self._add_rule("array-more", '"," space value'), 0, OPEN_ARRAY_ITEMS - 1)
            items = self._add_rule("array-items", f"value {more}")  # a `(...)?` of it is refused
            added = self._add_rule(name, f'"[" space {items}? "]" space')
            dependency = "value"
        else:
            return super()._add_primitive(name, rule)
        if dependency not in self._rules:
            self._add_primitive(dependency, PRIMITIVE_RULES[dependency])
        return added

    def visit(self, schema: dict[str, Any], name: str) -> str:
        self.visits += 1
        if self.visits > MAX_SCHEMA_VISITS:
            raise SchemaTooLarge(f"the schema expands to more than {MAX_SCHEMA_VISITS} subschemas")
        if not isinstance(schema, dict) or any(key in schema for key in ("$ref", "oneOf", "anyOf")):
            return super().visit(schema, name)
        rule_name = name + "-" if name in RESERVED_NAMES else name or "root"
        kind = schema.get("type")
        valued = "const" in schema or "enum" in schema
        if isinstance(kind, list):
            if valued:
                return super().visit({key: value for key, value in schema.items() if key != "type"}, name)
            distinct = [each for i, each in enumerate(kind) if each not in kind[:i]]
            alternatives = [{**schema, "type": each} for each in distinct]
            return self._add_rule(rule_name, self._generate_union_rule(name, alternatives))
        if valued:
            return super().visit(schema, name)
        if kind is None and all(key in ANNOTATIONS for key in schema):
            # no type and nothing that constrains: any JSON value (a tool's property described
            # in words only; the library knows only the empty schema as that)
            return self._add_rule(rule_name, self._add_primitive("value", PRIMITIVE_RULES["value"]))
        if kind in ("integer", "number"):
            low, low_open, high, high_open = numeric_bounds(schema)
            if low is None and high is None:
                return super().visit(schema, name)
            if kind == "integer":
                first = None if low is None else (math.floor(low) + 1 if low_open else math.ceil(low))
                last = None if high is None else (math.ceil(high) - 1 if high_open else math.floor(high))
                body = integer_range(first, last)
            else:
                body = number_range(low, low_open, high, high_open)
            if body is None:
                raise ValueError(f"no {kind} satisfies the bounds of {json.dumps(schema)}")
            return self._add_rule(rule_name, f"{body} space")
        if kind == "string" and not _has_string_format(schema):
            low, high = count(schema, "minLength"), count(schema, "maxLength")
            if low is None and high is None:
                return super().visit(schema, name)
            char = self._add_primitive("char", PRIMITIVE_RULES["char"])
            what = f"minLength/maxLength of {json.dumps(schema)}"
            if high is None:
                body = _capped(char, low or 0, max(low or 0, OPEN_STRING_CHARS))
            else:
                body = _counted(char, low or 0, high, what)
            return self._add_rule(rule_name, " ".join(part for part in ('"\\""', body, '"\\"" space') if part))
        items = schema.get("items", {})
        if kind == "array" and "prefixItems" not in schema and isinstance(items, dict):
            low, high = count(schema, "minItems"), count(schema, "maxItems")
            if "items" in schema:
                item = self.visit(items, f"{name}{'-' if name else ''}item")
            else:
                item = self._add_primitive("value", PRIMITIVE_RULES["value"])
            what = f"minItems/maxItems of {json.dumps(schema)}"
            more = f'("," space {item})'
            low = low or 0

            def rest(first: int) -> str:
                if high is None:  # a repeated group must be a rule of its own for llama.cpp
                    separated = self._add_rule(f"{rule_name}-more", f'"," space {item}')
                    return _capped(separated, first, max(first, OPEN_ARRAY_ITEMS - 1))
                return _counted(more, first, high - 1, what)

            if low:
                body = f"{item} {rest(low - 1)}"
            elif high == 0:
                body = ""
            elif high is None:  # llama.cpp refuses `(...)?` around the capped run: a rule of its own
                body = self._add_rule(f"{rule_name}-items", f"{item} {rest(0)}") + "?"
            else:
                body = f"({item} {rest(0)})?"
            return self._add_rule(rule_name, " ".join(part for part in ('"[" space', body, '"]" space') if part))
        return super().visit(schema, name)


def _has_string_format(schema: dict[str, Any]) -> bool:
    """Whether the converter writes this string from its ``pattern`` or a known ``format``."""
    form = schema.get("format") or ""
    return "pattern" in schema or bool(re.match(r"^uuid[1-5]?$", form)) or f"{form}-string" in STRING_FORMAT_RULES


# llama.cpp refuses a counted repetition above 2000 (MAX_REPETITION_THRESHOLD in
# src/llama-grammar.cpp), so longer runs are written in pieces of at most this many.
_REPEAT_PIECE = 1000


def _counted(item: str, low: int, high: int | None, what: str) -> str:
    """GBNF for `item` repeated `low` to `high` times (no upper limit when None); may be "".

    Fixed counts become ``item{1000} item{1000} item{k}``; an optional run longer than one piece
    becomes ``(item{1000} MORE | item{0,999})``, whose two branches never match the same count,
    so the grammar stays unambiguous.
    """
    if high is not None and high < low:
        raise ValueError(f"no value satisfies the {what}")
    parts = []
    fixed = low
    while fixed > 0:
        size = min(fixed, _REPEAT_PIECE)
        parts.append(item if size == 1 else f"{item}{{{size}}}")
        fixed -= size
    if high is None:
        parts.append(f"{item}*")
    elif high > low:
        extra = high - low
        optional = f"{item}{{0,{extra % _REPEAT_PIECE}}}" if extra % _REPEAT_PIECE else ""
        piece, shorter = f"{item}{{{_REPEAT_PIECE}}}", f"{item}{{0,{_REPEAT_PIECE - 1}}}"
        for _ in range(extra // _REPEAT_PIECE):
            optional = f"({piece} {optional} | {shorter})" if optional else f"({piece} | {shorter})"
        parts.append(optional)
    return " ".join(parts)


def _capped(item: str, low: int, high: int) -> str:
    """GBNF for `item` repeated `low` to `high` times where `high` is an open side's cap.

    `_counted` writes ``high - low`` optional units, each a rule for llama.cpp; for a cap of
    100,000 that is 0.05 s and 22 MB per rule. Here the optional part is whole pieces of
    `_REPEAT_PIECE` then a shorter tail, with counts below k pieces and from k pieces on as two
    branches, so no count matches twice and the rule is about three pieces long.
    """
    extra = high - low
    if extra < 2 * _REPEAT_PIECE:
        return _counted(item, low, high, "")
    # every repetition in a group of its own: llama.cpp multiplies the counts of the
    # repetitions within one sequence and refuses a product from 2000 on
    pieces, tail = divmod(extra, _REPEAT_PIECE)
    piece = f"({item}{{{_REPEAT_PIECE}}})"
    below = f"({piece}{{0,{pieces - 1}}}) ({item}{{0,{_REPEAT_PIECE - 1}}})"
    full = f"({piece}{{{pieces}}})" + (f" ({item}{{0,{tail}}})" if tail else "")
    fixed = _counted(item, low, low, "")
    return f"{'(' + fixed + ') ' if fixed else ''}({below} | {full})"


def schema_to_gbnf(schema: dict[str, Any]) -> str:
    """GBNF for `schema` (what ``json_schema_to_gbnf`` does, with full literal escaping)."""
    document = json.loads(json.dumps(schema))
    if "$ref" in document:
        # The converter leaves references inside $defs unresolved when the root itself is a
        # reference; as the only alternative of a union the root is resolved like any node.
        definitions = {k: document.pop(k) for k in ("$defs", "definitions") if k in document}
        document = {"anyOf": [document], **definitions}
    converter = _SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    document = converter.resolve_refs(document, "input")
    converter.visit(document, "")
    return converter.format_grammar()
