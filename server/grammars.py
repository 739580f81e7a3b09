"""GBNF grammars that constrain sampling for tool calls and structured output.

JSON schemas are turned into GBNF by llama-cpp-python's pure-Python converter
(`SchemaConverter`, which ``json_schema_to_gbnf`` drives). Each schema is converted on its own
and every rule name it produced is prefixed (``t0-root``, ``t0-space``, ...), so the schemas
of several tools can live in one grammar without their rule names (which derive from property
and ``$defs`` names) colliding.

Lazy grammars and their triggers, as implemented by the llama.cpp vendored in
llama-cpp-python 0.3.36 (``llama_grammar_accept_impl`` / ``llama_grammar_trigger_pattern::find``
in src/llama-grammar.cpp, reached through ``llama_sampler_init_grammar_lazy_patterns``):

- While awaiting its trigger the sampler constrains nothing. Every accepted token's text is
  appended to a buffer holding *all* text generated since the sampler was created (it only
  sees tokens passed to ``llama_sampler_accept``: the generated ones, reasoning included).
- After each token each pattern (a std::regex, ECMAScript syntax) is tried on the whole
  buffer: with ``regex_match`` when the pattern both starts with ``^`` and ends with ``$``,
  otherwise with ``regex_search``, so an unanchored pattern matches anywhere and ``^`` pins it
  to the start of the generated text.
- On a match the grammar starts at the first capture group that matched something, or at
  the start of the whole match when there is none. The buffered tokens overlapping that
  position are replayed into the grammar (a token straddling it contributes only its tail),
  so the grammar must describe the output from exactly there, starting with the marker.
- A trigger token (by id) fires when sampled; the token itself is then the grammar's first
  input, so a grammar used with trigger tokens must begin with that token's text.
- Once the grammar is complete the stacks are empty and only end-of-generation tokens pass,
  so a lazy tool grammar ends the reply after its last call.
- Replaying (like accepting) a token whose text the grammar cannot take throws a C++
  exception out of ``llama_sampler_accept``, which aborts a Python process. Sampled tokens are
  safe (the grammar filtered them), but the token that completes a trigger pattern is replayed
  unfiltered: its text after the marker must fit. The grammars here therefore allow a little
  whitespace wherever a model may put it right after a marker.

The patterns used here are plain markers (``<tool_call>``, ``\\[TOOL_CALLS\\]``) or short
anchored ones (``^\\s*(\\{)``): cheap for std::regex on long buffers. Non-lazy grammars start at
the first generated token; when a model reasons first they can let a think block through
(`reasoning`, `starts_in_reasoning`), otherwise the constraint would forbid the reasoning.
"""

import llama_cpp  # noqa: F401,I001  -- llama_cpp must be imported before numpy

import functools
import json
import math
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Callable

from llama_cpp.llama_grammar import PRIMITIVE_RULES, RESERVED_NAMES, STRING_FORMAT_RULES, SchemaConverter

from .errors import InvalidRequest
from .tool_calls import (
    FORMATS,
    HERMES_CLOSE,
    HERMES_OPEN,
    MISTRAL_ARGS,
    MISTRAL_CALL_ID,
    MISTRAL_CALLS,
    THINK_CLOSE,
    THINK_OPEN,
)

TOOL_NAME_RE = re.compile(r"[a-zA-Z0-9_-]{1,64}")
TOOL_CHOICE_MODES = ("none", "auto", "required")
ANY_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}


@dataclass(slots=True, frozen=True)
class ToolChoice:
    """A validated `tool_choice`: mode "none", "auto", "required" or "function" (with `name`)."""

    mode: str
    name: str | None = None


@dataclass(slots=True)
class GrammarSpec:
    """A grammar for the sampler; a lazy one waits for a trigger pattern or token.

    `trigger_tokens` are token texts; use those that are a single token in the vocabulary.
    """

    grammar: str
    lazy: bool = False
    trigger_patterns: list[str] = field(default_factory=list)
    trigger_tokens: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- GBNF text


def gbnf_literal(text: str) -> str:
    """A GBNF string literal matching `text` exactly."""
    out = []
    for ch in text:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ch == "\x7f":
            out.append(f"\\x{ord(ch):02X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _class_char(ch: str) -> str:
    if ch.isascii() and ch.isalnum():
        return ch
    code = ord(ch)
    if code < 0x80:
        return f"\\x{code:02X}"
    if code < 0x10000:
        return f"\\u{code:04X}"
    return f"\\U{code:08X}"


def _char_class(chars: list[str], negated: bool = False) -> str:
    return "[" + ("^" if negated else "") + "".join(_class_char(c) for c in chars) + "]"


def grammar_is_valid(grammar: str, root: str = "root") -> bool:
    """Whether llama.cpp's own GBNF parser accepts `grammar` (no model needed)."""
    sampler = llama_cpp.llama_sampler_init_grammar(None, grammar.encode(), root.encode())
    if not sampler:
        return False
    llama_cpp.llama_sampler_free(sampler)
    return True


_RULE_START_RE = re.compile(r"^([A-Za-z0-9-]+) ::= ", re.M)
_GBNF_TOKEN_RE = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|\{[^}]*\}|[A-Za-z0-9-]+|.', re.S)
_RULE_NAME_RE = re.compile(r"[A-Za-z0-9-]+")


def _split_rules(text: str) -> dict[str, str]:
    """``name ::= body`` lines of a grammar as a dict."""
    starts = list(_RULE_START_RE.finditer(text))
    rules = {}
    for i, match in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
        rules[match.group(1)] = text[match.end() : end].strip("\n")
    return rules


def _rename(body: str, mapping: dict[str, str]) -> str:
    """`body` with rule references renamed; literals, classes and counts are left alone."""
    parts = []
    for token in _GBNF_TOKEN_RE.findall(body):
        if _RULE_NAME_RE.fullmatch(token) and token in mapping:
            parts.append(mapping[token])
        else:
            parts.append(token)
    return "".join(parts)


class _Grammar:
    """Rules collected for one grammar, written with ``root`` first."""

    def __init__(self) -> None:
        self.rules: dict[str, str] = {}

    def add(self, name: str, body: str) -> str:
        self.rules[name] = body
        return name

    def schema(self, schema: dict[str, Any], prefix: str, param: str) -> str:
        """Add the rules for JSON values matching `schema`; answers their start rule."""
        rules = _convert_schema(schema, param)
        mapping = {name: f"{prefix}-{name}" for name in rules}
        for name, body in rules.items():
            self.rules[mapping[name]] = _rename(body, mapping)
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
            alternatives = [f"{_char_class(moving, negated=True)} {prefix}-0"]
            for target, group in sorted(targets.items()):
                if not target:
                    continue
                match = gbnf_literal(group[0]) if len(group) == 1 else _char_class(group)
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


def _convert_schema(schema: dict[str, Any], param: str) -> dict[str, str]:
    """The converter's rules for `schema`; a schema it cannot handle is the client's error.

    The converter copies regex escapes of ``pattern`` into GBNF verbatim, so ``\\d``, ``\\w``
    and ``\\s`` are spelled out as character classes first; a pattern that still cannot be
    converted is dropped (that string is then unconstrained) rather than failing the request.
    """
    try:
        text = _schema_to_gbnf(_with_patterns(schema, _usable_pattern))
    except Exception as exc:  # the converter raises assorted errors for schemas it rejects
        raise InvalidRequest(f"unsupported JSON schema: {exc}", param=param) from None
    if not grammar_is_valid(text):
        raise InvalidRequest("the JSON schema converts to a grammar llama.cpp rejects", param=param)
    return _split_rules(text)


@functools.lru_cache(maxsize=256)
def _usable_pattern(pattern: str) -> str | None:
    """`pattern` in a form the converter turns into valid GBNF, or None if there is none."""
    portable = _portable_pattern(pattern)
    try:
        text = _schema_to_gbnf({"type": "string", "pattern": portable})
    except Exception:  # unsupported regex syntax
        return None
    return portable if grammar_is_valid(text) else None


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
    """

    def _format_literal(self, literal: str) -> str:
        return gbnf_literal(literal)

    def visit(self, schema: dict[str, Any], name: str) -> str:
        if not isinstance(schema, dict) or any(key in schema for key in ("$ref", "oneOf", "anyOf")):
            return super().visit(schema, name)
        rule_name = name + "-" if name in RESERVED_NAMES else name or "root"
        kind = schema.get("type")
        valued = "const" in schema or "enum" in schema
        if isinstance(kind, list):
            if valued:
                return super().visit({key: value for key, value in schema.items() if key != "type"}, name)
            alternatives = [{**schema, "type": each} for each in kind]
            return self._add_rule(rule_name, self._generate_union_rule(name, alternatives))
        if valued:
            return super().visit(schema, name)
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
            low, high = _count(schema, "minLength"), _count(schema, "maxLength")
            if low is None and high is None:
                return super().visit(schema, name)
            char = self._add_primitive("char", PRIMITIVE_RULES["char"])
            body = _counted(char, low or 0, high, f"minLength/maxLength of {json.dumps(schema)}")
            return self._add_rule(rule_name, " ".join(part for part in ('"\\""', body, '"\\"" space') if part))
        items = schema.get("items", {})
        if kind == "array" and "prefixItems" not in schema and isinstance(items, dict):
            low, high = _count(schema, "minItems"), _count(schema, "maxItems")
            if low is None and high is None:
                return super().visit(schema, name)
            if "items" in schema:
                item = self.visit(items, f"{name}{'-' if name else ''}item")
            else:
                item = self._add_primitive("value", PRIMITIVE_RULES["value"])
            what = f"minItems/maxItems of {json.dumps(schema)}"
            more = f'("," space {item})'
            low = low or 0
            if low:
                body = f"{item} {_counted(more, low - 1, None if high is None else high - 1, what)}"
            elif high == 0:
                body = ""
            else:
                body = f"({item} {_counted(more, 0, None if high is None else high - 1, what)})?"
            return self._add_rule(rule_name, " ".join(part for part in ('"[" space', body, '"]" space') if part))
        return super().visit(schema, name)


def _has_string_format(schema: dict[str, Any]) -> bool:
    """Whether the converter writes this string from its ``pattern`` or a known ``format``."""
    form = schema.get("format") or ""
    return "pattern" in schema or bool(re.match(r"^uuid[1-5]?$", form)) or f"{form}-string" in STRING_FORMAT_RULES


def _count(schema: dict[str, Any], key: str) -> int | None:
    """A length or item count keyword as an int; None when absent or not a count."""
    value = schema.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not value.is_integer():
        return None
    return int(value) if value >= 0 else None


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
        count = min(fixed, _REPEAT_PIECE)
        parts.append(item if count == 1 else f"{item}{{{count}}}")
        fixed -= count
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


# --------------------------------------------------------------------------- numeric bounds


def _bound(value: object) -> Decimal | None:
    """A bound keyword's value as an exact decimal; None unless it is a finite number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float):
        # the shortest text that reads back as this float: what a JSON validator compares with
        return Decimal(repr(value)) if math.isfinite(value) else None
    return Decimal(value)


def numeric_bounds(schema: dict[str, Any]) -> tuple[Decimal | None, bool, Decimal | None, bool]:
    """``(low, low_open, high, high_open)`` from a schema's bound keywords (None: unbounded).

    ``exclusiveMinimum``/``exclusiveMaximum`` may be numbers (JSON Schema draft 6 on) or, as in
    draft 4, ``true`` to make ``minimum``/``maximum`` exclusive. Of two bounds on one side the
    tighter holds; values that are not finite numbers are ignored.
    """
    lows: list[tuple[Decimal, bool]] = []
    highs: list[tuple[Decimal, bool]] = []
    for key, flag, bounds in (("minimum", "exclusiveMinimum", lows), ("maximum", "exclusiveMaximum", highs)):
        inclusive = _bound(schema.get(key))
        if inclusive is not None:
            bounds.append((inclusive, schema.get(flag) is True))
        exclusive = _bound(schema.get(flag))
        if exclusive is not None:
            bounds.append((exclusive, True))
    low, low_open = max(lows, default=(None, False))  # on a tie the open bound wins
    high, high_open = min(highs, key=lambda bound: (bound[0], not bound[1]), default=(None, False))
    return low, low_open, high, high_open


def _alternation(alternatives: list[str]) -> str:
    return alternatives[0] if len(alternatives) == 1 else "(" + " | ".join(alternatives) + ")"


def _render_digits(sequence: list[tuple[int, int]]) -> str:
    """GBNF for a sequence of digit ranges: runs of fixed digits as one literal, ``[0-9]{k}``."""
    parts = []
    i = 0
    while i < len(sequence):
        low, high = sequence[i]
        j = i + 1
        if low == high:
            while j < len(sequence) and sequence[j][0] == sequence[j][1]:
                j += 1
            parts.append('"' + "".join(str(digit) for digit, _ in sequence[i:j]) + '"')
        elif (low, high) == (0, 9):
            while j < len(sequence) and sequence[j] == (0, 9):
                j += 1
            parts.append("[0-9]" if j - i == 1 else f"[0-9]{{{j - i}}}")
        else:
            parts.append(f"[{low}-{high}]")
        i = j
    return " ".join(parts)


def _same_length(low: str, high: str) -> list[list[tuple[int, int]]]:
    """Digit-range sequences matching exactly the digit strings from `low` to `high`, both of
    one length (strings of one length compare like the numbers they spell).

    Where the first digits agree, that digit is fixed and the rest is the same problem one digit
    shorter. Where they differ (a < b), the strings fall into three sets: first digit a with a
    rest of at least low's rest, first digit strictly between a and b with any rest, first digit
    b with a rest of at most high's rest. A side whose bound rest is 00... (or 99...) restricts
    nothing, so its digit joins the middle set.
    """
    if not low:
        return [[]]
    first, last = int(low[0]), int(high[0])
    size = len(low) - 1
    if first == last:
        return [[(first, first), *tail] for tail in _same_length(low[1:], high[1:])]
    sequences = []
    low_free = low[1:] == "0" * size
    high_free = high[1:] == "9" * size
    if not low_free:
        sequences += [[(first, first), *tail] for tail in _same_length(low[1:], "9" * size)]
    middle = (first if low_free else first + 1, last if high_free else last - 1)
    if middle[0] <= middle[1]:
        sequences.append([middle] + [(0, 9)] * size)
    if not high_free:
        sequences += [[(last, last), *tail] for tail in _same_length("0" * size, high[1:])]
    return sequences


def natural_range(low: int, high: int | None) -> list[str]:
    """GBNF alternatives matching exactly the numerals of the integers from `low` to `high`.

    ``0 <= low``; `high` None means no upper bound. Numerals are written without leading zeros
    ("0" itself excepted). Numerals of one length compare as strings, so the range is cut into
    one piece per length (the first from `low`, the last up to `high`, those between from
    10^(n-1) to 10^n - 1), each spelled by `_same_length`; with no upper bound every numeral
    longer than `low`'s is allowed as ``[1-9] [0-9]{n,}``, however many digits it has.
    An empty range gives no alternatives.

    For example [7, 123]: ``[7-9] | [1-9] [0-9] | "1" [0-1] [0-9] | "12" [0-3]``.
    """
    if high is not None and high < low:
        return []
    width = len(str(low))
    top = width if high is None else len(str(high))
    alternatives = []
    for size in range(width, top + 1):
        start = low if size == width else 10 ** (size - 1)
        end = high if high is not None and size == top else 10**size - 1
        alternatives += [_render_digits(sequence) for sequence in _same_length(str(start), str(end))]
    if high is None:
        alternatives.append(f"[1-9] [0-9]{{{width},}}")
    return alternatives


def integer_range(low: int | None, high: int | None) -> str | None:
    """A GBNF expression matching exactly the JSON integers from `low` to `high` (None: that
    side is unbounded), or None when there are none. Negative numbers are "-" and a numeral of
    at least 1 (never "-0")."""
    alternatives = []
    if high is None or high >= 0:
        alternatives += natural_range(max(low, 0) if low is not None else 0, high)
    if low is None or low < 0:
        negative = natural_range(1 if high is None or high >= 0 else -high, None if low is None else -low)
        if negative:
            alternatives.append('"-" ' + _alternation(negative))
    return _alternation(alternatives) if alternatives else None


# The converter allows 1-16 fraction digits; bounded numbers allow as many (or the bounds' own).
_FRACTION_PLACES = 16


def _decimal_parts(value: Decimal) -> tuple[int, str]:
    """A non-negative decimal's integer part and fraction digits (without trailing zeros)."""
    whole, _, fraction = format(value, "f").partition(".")
    return int(whole), fraction.rstrip("0")


def _fraction(low: str | None, low_open: bool, high: str | None, high_open: bool, places: int) -> str | None:
    """GBNF for the optional ``.DIGITS`` after an integer part, for fractions 0.DIGITS from
    0.`low` to 0.`high` (a bound None: that side is unbounded; open: the bound itself excluded).

    Answers None when no suffix fits and "" when only the empty one does. Digits are read left
    to right, tracking whether those so far still equal the bound's first digits ("tight"):
    while tight to the low bound the next digit may not go below the bound's, and the rest
    only matters if it is equal; likewise for the high bound. Off both bounds, any digits follow.
    """

    def rest(i: int, tight_low: bool, tight_high: bool) -> tuple[bool, str | None]:
        # (whether the digits may end here, GBNF for one or more further digits or None)
        assert low is not None or not tight_low
        assert high is not None or not tight_high
        if tight_low and i >= len(low) and not low_open:
            tight_low = False  # the digits so far equal the whole bound: anything further is >=
        can_end = (not tight_low or (not low_open and not low[i:].strip("0"))) and (
            not tight_high or not high_open or bool(high[i:].strip("0"))
        )
        if i == places:
            return can_end, None
        if not tight_low and not tight_high:
            return True, f"[0-9]{{1,{places - i}}}"
        lowest = int(low[i]) if tight_low and i < len(low) else 0
        highest = (int(high[i]) if i < len(high) else 0) if tight_high else 9
        runs: list[list] = []  # [first digit, last digit, stays tight low, stays tight high]
        for digit in range(lowest, highest + 1):
            key = (tight_low and digit == lowest, tight_high and digit == highest)
            if runs and tuple(runs[-1][2:]) == key:
                runs[-1][1] = digit
            else:
                runs.append([digit, digit, *key])
        options = []
        for first, last, next_low, next_high in runs:
            ends, more = rest(i + 1, next_low, next_high)
            digit = _render_digits([(first, last)])
            if more is not None:
                options.append(f"{digit} ({more}){'?' if ends else ''}")
            elif ends:
                options.append(digit)
        return can_end, " | ".join(options) or None

    can_end, digits = rest(0, low is not None, high is not None)
    if digits is None:
        return "" if can_end else None
    return f'("." ({digits}))?' if can_end else f'"." ({digits})'


def _magnitudes(low: Decimal, low_open: bool, high: Decimal | None, high_open: bool) -> list[str]:
    """GBNF alternatives for unsigned numerals (integer part, optional fraction, no exponent) of
    the values from `low` (>= 0) to `high` (None: unbounded)."""
    if high is not None and (high < low or (high == low and (low_open or high_open))):
        return []
    low_whole, low_digits = _decimal_parts(low)
    high_whole, high_digits = _decimal_parts(high) if high is not None else (None, "")
    places = max(_FRACTION_PLACES, len(low_digits), len(high_digits))
    if high_whole == low_whole:
        pieces = [([f'"{low_whole}"'], _fraction(low_digits, low_open, high_digits, high_open, places))]
    else:
        between = natural_range(low_whole + 1, None if high_whole is None else high_whole - 1)
        pieces = [
            ([f'"{low_whole}"'], _fraction(low_digits, low_open, None, False, places)),
            (between, _fraction(None, False, None, False, places)),
        ]
        if high_whole is not None:
            pieces.append(([f'"{high_whole}"'], _fraction(None, False, high_digits, high_open, places)))
    return [
        f"{_alternation(numerals)} {suffix}".rstrip() for numerals, suffix in pieces if numerals and suffix is not None
    ]


def number_range(low: Decimal | None, low_open: bool, high: Decimal | None, high_open: bool) -> str | None:
    """A GBNF expression for JSON numbers from `low` to `high`, or None when it matches none.

    Sound, not complete: every number it matches is in range, and it matches every number in
    range written without exponent, with at most 16 fraction digits (or as many as a bound has),
    and not as negative zero; exponent forms are not allowed.
    """
    alternatives = []
    if high is None or high > 0 or (high == 0 and not high_open):
        start, start_open = (low, low_open) if low is not None and low >= 0 else (Decimal(0), False)
        alternatives += _magnitudes(start, start_open, high, high_open)
    if low is None or low < 0:
        start, start_open = (-high, high_open) if high is not None and high < 0 else (Decimal(0), True)
        negative = _magnitudes(start, start_open, None if low is None else -low, low_open)
        if negative:
            alternatives.append('"-" ' + _alternation(negative))
    return _alternation(alternatives) if alternatives else None


def _schema_to_gbnf(schema: dict[str, Any]) -> str:
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


_SCHEMA_DATA_KEYWORDS = frozenset(("const", "enum", "default", "examples"))


def _with_patterns(schema: Any, rewrite: Callable[[str], str | None]) -> Any:
    """A copy of `schema` with every string ``pattern`` rewritten (dropped where that gives None)."""
    if isinstance(schema, list):
        return [_with_patterns(item, rewrite) for item in schema]
    if not isinstance(schema, dict):
        return schema
    copy = {}
    for key, value in schema.items():
        if key in _SCHEMA_DATA_KEYWORDS:
            copy[key] = value
        elif key == "pattern" and isinstance(value, str):
            usable = rewrite(value)
            if usable is not None:
                copy[key] = usable
        else:
            copy[key] = _with_patterns(value, rewrite)
    return copy


# --------------------------------------------------------------------------- validation


def validate_tools(tools: object) -> list[dict[str, Any]]:
    """Check an OpenAI `tools` list; answers it normalised (parameters always present)."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise InvalidRequest("'tools' must be an array", param="tools")
    seen: set[str] = set()
    return [_validate_tool(tool, f"tools[{i}]", seen) for i, tool in enumerate(tools)]


def _validate_tool(tool: object, at: str, seen: set[str]) -> dict[str, Any]:
    if not isinstance(tool, dict):
        raise InvalidRequest("a tool must be an object", param=at)
    if tool.get("type", "function") != "function":
        raise InvalidRequest("only tools of type 'function' are supported", param=f"{at}.type")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise InvalidRequest("'function' must be an object", param=f"{at}.function")
    name = function.get("name")
    if not isinstance(name, str) or not TOOL_NAME_RE.fullmatch(name):
        raise InvalidRequest(
            "a function name must be 1-64 characters of a-z, A-Z, 0-9, '_' and '-'", param=f"{at}.function.name"
        )
    if name in seen:
        raise InvalidRequest(f"the function name '{name}' is used twice", param=f"{at}.function.name")
    seen.add(name)
    clean: dict[str, Any] = {"name": name}
    description = function.get("description")
    if description is not None:
        if not isinstance(description, str):
            raise InvalidRequest("'description' must be a string", param=f"{at}.function.description")
        clean["description"] = description
    clean["parameters"] = _validate_parameters(function.get("parameters"), f"{at}.function.parameters")
    strict = function.get("strict")
    if strict is not None:
        if not isinstance(strict, bool):
            raise InvalidRequest("'strict' must be a boolean", param=f"{at}.function.strict")
        clean["strict"] = strict
    return {"type": "function", "function": clean}


def _validate_parameters(parameters: object, param: str) -> dict[str, Any]:
    if parameters is None:
        return {"type": "object", "properties": {}}
    if not isinstance(parameters, dict):
        raise InvalidRequest("'parameters' must be a JSON schema object", param=param)
    if parameters.get("type", "object") != "object":
        raise InvalidRequest("'parameters' must describe an object (type 'object')", param=param)
    _convert_schema(parameters, param)
    return parameters


def validate_tool_choice(tool_choice: object, tools: list[dict[str, Any]]) -> ToolChoice:
    """Check `tool_choice` against validated `tools`; absent means "auto" with tools, else "none"."""
    if tool_choice is None:
        return ToolChoice("auto" if tools else "none")
    if isinstance(tool_choice, str):
        if tool_choice not in TOOL_CHOICE_MODES:
            raise InvalidRequest(
                f"'tool_choice' must be one of {', '.join(TOOL_CHOICE_MODES)} or a function", param="tool_choice"
            )
        if tool_choice == "required" and not tools:
            raise InvalidRequest("'tool_choice' is 'required' but no tools are given", param="tool_choice")
        return ToolChoice(tool_choice)
    if not isinstance(tool_choice, dict) or tool_choice.get("type") != "function":
        raise InvalidRequest(
            "'tool_choice' must be a string or {\"type\": \"function\", \"function\": {\"name\": ...}}",
            param="tool_choice",
        )
    function = tool_choice.get("function")
    name = function.get("name") if isinstance(function, dict) else tool_choice.get("name")
    if not isinstance(name, str):
        raise InvalidRequest("'tool_choice' names no function", param="tool_choice")
    if name not in {tool["function"]["name"] for tool in tools}:
        raise InvalidRequest(f"'tool_choice' names the unknown function '{name}'", param="tool_choice")
    return ToolChoice("function", name)


# --------------------------------------------------------------------------- tool-call grammars


def tool_call_grammar(
    tools: list[dict[str, Any]],
    choice: ToolChoice,
    format: str,
    *,
    parallel_tool_calls: bool = True,
    reasoning: bool = False,
    starts_in_reasoning: bool = False,
) -> GrammarSpec | None:
    """The grammar that enforces `choice` over validated `tools` in tool-call `format`.

    "auto": lazy, triggered where a call starts, covering the call(s) from there to the end.
    "required" / a named function: not lazy; the whole reply is one or more calls (exactly one
    without `parallel_tool_calls`), after an optional think block when the model reasons.
    "none", no tools, or the "none" format: None.
    """
    if format not in FORMATS:
        raise ValueError(f"unknown tool call format {format!r}")
    if choice.mode == "none" or not tools or format == "none":
        return None
    selected = [
        (i, tool["function"])
        for i, tool in enumerate(tools)
        if choice.mode != "function" or tool["function"]["name"] == choice.name
    ]
    grammar = _Grammar()
    lazy = choice.mode == "auto"
    # a forced Hermes call is written exactly as the tool prompt and the renderer write it,
    # so that a history echoing the call back re-tokenizes to the same prefix
    builder = _hermes_canonical if format == "hermes" and not lazy else _FORMAT_BUILDERS[format]
    body = builder(grammar, selected, parallel_tool_calls)
    if lazy:
        grammar.add("root", body)
        patterns, tokens = _TRIGGERS[format]
    else:
        grammar.add("root", _with_reasoning(grammar, body, reasoning, starts_in_reasoning))
        patterns, tokens = [], []
    text = grammar.text()
    if not grammar_is_valid(text):
        raise InvalidRequest("the tools' schemas give a grammar llama.cpp rejects", param="tools")
    return GrammarSpec(text, lazy, list(patterns), list(tokens))


_TRIGGERS: dict[str, tuple[list[str], list[str]]] = {
    "hermes": ([re.escape(HERMES_OPEN)], [HERMES_OPEN]),
    "hermes_xml": ([re.escape(HERMES_OPEN)], [HERMES_OPEN]),
    "llama3": ([r"^\s*(?:<\|python_tag\|>)?\s*(\{)"], []),
    "mistral": ([re.escape(MISTRAL_CALLS)], [MISTRAL_CALLS]),
    "json": ([r"^\s*([\[{])"], []),
}


def _with_reasoning(grammar: _Grammar, body: str, reasoning: bool, starts_in_reasoning: bool) -> str:
    """Let a think block precede `body`: required when the prompt opened one, else optional."""
    if not (reasoning or starts_in_reasoning):
        return body
    gap = grammar.add("think-gap", r"[ \n]{0,4}")
    think = f"{grammar.until('think', THINK_CLOSE)} {gap}"
    if starts_in_reasoning:
        return f"{think} {body}"
    return f"({gbnf_literal(THINK_OPEN)} {think})? {body}"


def _header(name: str, key: str) -> str:
    """``{"name": "NAME", "KEY": `` allowing a little whitespace between the tokens."""
    return " ".join(
        [
            '"{" sp',
            gbnf_literal('"name"'),
            'sp ":" sp',
            gbnf_literal(json.dumps(name)),
            'sp "," sp',
            gbnf_literal(json.dumps(key)),
            'sp ":" sp',
        ]
    )


def _spacing(grammar: _Grammar) -> None:
    """Whitespace rules shared by the call formats (bounded, so sampling cannot run away)."""
    grammar.add("sp", r"[ \t\n]{0,2}")
    grammar.add("gap", r"[ \t\r\n]{0,4}")


def _json_calls(grammar: _Grammar, functions: list[tuple[int, dict[str, Any]]], key: str, extra: str = "") -> str:
    """A rule for one JSON call object of any of `functions`, arguments under `key`."""
    _spacing(grammar)
    alternatives = []
    for i, function in functions:
        args = grammar.schema(function["parameters"], f"t{i}", f"tools[{i}].function.parameters")
        alternatives.append(grammar.add(f"call-{i}", f'{_header(function["name"], key)} {args} {extra}"}}"'))
    return grammar.add("call", " | ".join(alternatives))


def _repeat(grammar: _Grammar, item: str, separator: str, parallel: bool) -> str:
    return grammar.add("calls", f"{item} ({separator} {item})*" if parallel else item)


def _hermes(grammar: _Grammar, functions: list[tuple[int, dict[str, Any]]], parallel: bool) -> str:
    call = _json_calls(grammar, functions, "arguments")
    block = grammar.add("tool-call", f"{gbnf_literal(HERMES_OPEN)} gap {call} gap {gbnf_literal(HERMES_CLOSE)}")
    return _repeat(grammar, block, "gap", parallel)


def _hermes_canonical(grammar: _Grammar, functions: list[tuple[int, dict[str, Any]]], parallel: bool) -> str:
    """``<tool_call>\\n{"name": "NAME", "arguments": ARGS}\\n</tool_call>``, calls one per line:
    the form `server.chat.hermes_call_text` renders, with no freedom outside the arguments."""
    alternatives = []
    for i, function in functions:
        args = grammar.schema(function["parameters"], f"t{i}", f"tools[{i}].function.parameters")
        head = gbnf_literal('{"name": ' + json.dumps(function["name"]) + ', "arguments": ')
        alternatives.append(grammar.add(f"call-{i}", f'{head} {args} "}}"'))
    call = grammar.add("call", " | ".join(alternatives))
    block = grammar.add("tool-call", f"{gbnf_literal(HERMES_OPEN + chr(10))} {call} {gbnf_literal(chr(10) + HERMES_CLOSE)}")
    return _repeat(grammar, block, gbnf_literal(chr(10)), parallel)


def _llama3(grammar: _Grammar, functions: list[tuple[int, dict[str, Any]]], parallel: bool) -> str:
    call = _json_calls(grammar, functions, "parameters")
    return _repeat(grammar, call, r"[;\n] sp", parallel)


def _json(grammar: _Grammar, functions: list[tuple[int, dict[str, Any]]], parallel: bool) -> str:
    call = _json_calls(grammar, functions, "arguments")
    if not parallel:
        return call
    return grammar.add("calls", f'{call} | "[" sp {call} ("," sp {call})* sp "]"')


def _mistral(grammar: _Grammar, functions: list[tuple[int, dict[str, Any]]], parallel: bool) -> str:
    mistral_id = '"\\"" [a-zA-Z0-9]{9} "\\""'
    extra_id = f'("," sp {gbnf_literal(json.dumps("id"))} sp ":" sp {mistral_id} sp)? '
    call = _json_calls(grammar, functions, "arguments", extra_id)
    items = f'{call} (sp "," sp {call})*' if parallel else call
    array = grammar.add("call-array", f'"[" sp {items} sp "]"')
    named = []
    for i, function in functions:
        named.append(
            grammar.add(
                f"named-{i}",
                f"{gbnf_literal(function['name'])} ({gbnf_literal(MISTRAL_CALL_ID)} [a-zA-Z0-9]{{9}})? "
                f"{gbnf_literal(MISTRAL_ARGS)} t{i}-root",
            )
        )
    named_call = grammar.add("named-call", " | ".join(named))
    marker = gbnf_literal(MISTRAL_CALLS)
    named_calls = f"{named_call} ({marker} {named_call})*" if parallel else named_call
    return grammar.add("calls", f"{marker} ({array} | {named_calls})")


def _hermes_xml(grammar: _Grammar, functions: list[tuple[int, dict[str, Any]]], parallel: bool) -> str:
    _spacing(grammar)
    alternatives = [_xml_function(grammar, i, function) for i, function in functions]
    call = grammar.add("call", " | ".join(alternatives))
    block = grammar.add("tool-call", f"{gbnf_literal(HERMES_OPEN)} gap {call} gap {gbnf_literal(HERMES_CLOSE)}")
    return _repeat(grammar, block, "gap", parallel)


def _xml_function(grammar: _Grammar, i: int, function: dict[str, Any]) -> str:
    """``<function=NAME>`` with its required parameters in order, then optional ones in any order."""
    schema = function["parameters"]
    properties = schema.get("properties") or {}
    required = [key for key in schema.get("required", []) if key in properties]
    optional = [key for key in properties if key not in required]
    params = {key: _xml_parameter(grammar, i, n, key, schema) for n, key in enumerate(properties)}
    parts = [params[key] for key in required]
    if optional:
        parts.append("(" + " | ".join(params[key] for key in optional) + ")*")
    elif not properties:
        text = grammar.until("xml-text", "</parameter>")
        parts.append(f'("<parameter=" [a-zA-Z0-9_.-]+ ">\\n" {text} "\\n")*')
    parts.insert(0, gbnf_literal(f"<function={function['name']}>\n"))
    parts.append(gbnf_literal("</function>\n"))
    return grammar.add(f"fn-{i}", " ".join(parts))


def _xml_parameter(grammar: _Grammar, i: int, n: int, key: str, schema: dict[str, Any]) -> str:
    """One ``<parameter=KEY>`` block: raw text for strings, JSON for other types."""
    prop = schema["properties"][key]
    prop = prop if isinstance(prop, dict) else {}
    open_tag = gbnf_literal(f"<parameter={key}>\n")
    enum = prop.get("enum")
    if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
        values = " | ".join(gbnf_literal(v) for v in enum)
        body = f'{open_tag} ({values}) "\\n</parameter>\\n"'
    elif _is_text(prop):
        body = f'{open_tag} {grammar.until("xml-text", "</parameter>")} "\\n"'
    else:
        document = dict(prop)
        for defs in ("$defs", "definitions"):
            if defs in schema and defs not in document:
                document[defs] = schema[defs]
        value = grammar.schema(document, f"t{i}-p{n}", f"tools[{i}].function.parameters")
        body = f'{open_tag} {value} "\\n</parameter>\\n"'
    return grammar.add(f"fn-{i}-p{n}", body)


def _is_text(schema: dict[str, Any]) -> bool:
    """Whether an XML parameter value is written as raw text (strings, or untyped)."""
    kind = schema.get("type")
    if kind is None:
        return "$ref" not in schema and not any(k in schema for k in ("properties", "items", "anyOf", "oneOf"))
    return kind == "string" or (isinstance(kind, list) and "string" in kind)


_FORMAT_BUILDERS = {
    "hermes": _hermes,
    "hermes_xml": _hermes_xml,
    "llama3": _llama3,
    "mistral": _mistral,
    "json": _json,
}


# --------------------------------------------------------------------------- response_format


def response_format_grammar(
    response_format: object, *, reasoning: bool = False, starts_in_reasoning: bool = False
) -> str | None:
    """The grammar for an OpenAI `response_format`, or None for plain text.

    ``{"type": "text"}`` -> None; ``{"type": "json_object"}`` -> any JSON object (a ``schema``
    next to it is honoured); ``{"type": "json_schema", "json_schema": {"name", "schema",
    "strict"}}`` -> values of the schema. A think block may precede the JSON when the model
    reasons (see `tool_call_grammar`).
    """
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise InvalidRequest("'response_format' must be an object", param="response_format")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = response_format.get("schema")
        if schema is not None and not isinstance(schema, dict):
            raise InvalidRequest("'schema' must be a JSON schema object", param="response_format.schema")
        return _json_grammar(schema or ANY_OBJECT_SCHEMA, "response_format.schema", reasoning, starts_in_reasoning)
    if kind == "json_schema":
        schema = _json_schema_field(response_format.get("json_schema"))
        return _json_grammar(schema, "response_format.json_schema.schema", reasoning, starts_in_reasoning)
    raise InvalidRequest(
        "'response_format.type' must be one of text, json_object, json_schema", param="response_format.type"
    )


def _json_schema_field(spec: object) -> dict[str, Any]:
    at = "response_format.json_schema"
    if not isinstance(spec, dict):
        raise InvalidRequest("'json_schema' must be an object", param=at)
    name = spec.get("name")
    if name is not None and (not isinstance(name, str) or not TOOL_NAME_RE.fullmatch(name)):
        raise InvalidRequest("'name' must be 1-64 characters of a-z, A-Z, 0-9, '_' and '-'", param=f"{at}.name")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise InvalidRequest("'strict' must be a boolean", param=f"{at}.strict")
    schema = spec.get("schema")
    if schema is None:
        return ANY_OBJECT_SCHEMA
    if not isinstance(schema, dict):
        raise InvalidRequest("'schema' must be a JSON schema object", param=f"{at}.schema")
    return schema


def _json_grammar(schema: dict[str, Any], param: str, reasoning: bool, starts_in_reasoning: bool) -> str:
    grammar = _Grammar()
    value = grammar.schema(schema, "rf", param)
    grammar.add("root", _with_reasoning(grammar, value, reasoning, starts_in_reasoning))
    return grammar.text()
