"""Grammars for tool_choice and response_format: validation, llama.cpp acceptance, matching."""

import ctypes
import json
import math
import pathlib
import random
import re
import sys
from decimal import Decimal

import llama_cpp
import pytest

from warmslot.server.errors import InvalidRequest
from warmslot.server.gbnf.limits import (
    MAX_BOUND_DIGITS,
    MAX_BOUND_SIGNIFICANT_DIGITS,
    MAX_COUNT,
    MAX_OBJECT_PROPERTIES,
    MAX_SCHEMA_DEPTH,
)
from warmslot.server.gbnf.patterns import repetition_problem
from warmslot.server.gbnf.response_format import json_schema_grammar
from warmslot.server.gbnf.text import gbnf_literal
from warmslot.server.gbnf.tools import tool_call_grammar
from warmslot.server.output.parser import OutputParser
from warmslot.server.request.constraints import ToolChoice, parse_response_format, validate_tool_choice, validate_tools
from warmslot.slots import GrammarSpec, check_grammar
from warmslot.slots.llama_api.grammar import MAX_GRAMMAR_BYTES, MAX_GRAMMAR_REPETITIONS, MAX_GRAMMAR_RULES, measure

FORMATS = ("hermes", "hermes_xml", "llama3", "mistral", "json")


def grammar_is_valid(grammar: str) -> bool:
    """Whether llama.cpp accepts `grammar` (no model needed)."""
    return check_grammar(None, GrammarSpec(grammar)) is None


def response_format_grammar(response_format, **options) -> str | None:
    """The grammar text for an OpenAI `response_format`, as the server builds it."""
    parsed = parse_response_format(response_format)
    if parsed is None:
        return None
    return json_schema_grammar(parsed.schema, parsed.param, **options).grammar

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "unit": {"type": "string", "enum": ["c", "f"]},
            },
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "parameters": {
            "type": "object",
            "properties": {"q": {"$ref": "#/$defs/Item"}, "tags": {"type": "array", "items": {"type": "string"}}},
            "required": ["q"],
            "$defs": {"Item": {"type": "string"}},
        },
    },
}
COUNT = {
    "type": "function",
    "function": {
        "name": "count",
        "parameters": {
            "type": "object",
            "properties": {"q": {"$ref": "#/$defs/Item"}},
            "required": ["q"],
            "$defs": {"Item": {"type": "integer"}},
        },
    },
}
NOARGS = {"type": "function", "function": {"name": "ping"}}


# --------------------------------------------------------------------------- a small GBNF matcher


class Gbnf:
    """A pure-Python reading of GBNF that checks structure and matches whole strings.

    Supports what llama.cpp's parser does except token references: literals, character
    classes, rule references, groups, ``.``, and the ``* + ? {m} {m,} {m,n}`` repetitions.
    """

    TOKEN = re.compile(
        r'\s+|#[^\n]*|"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|\{\s*\d+\s*(?:,\s*\d*\s*)?\}|[A-Za-z0-9-]+|::=|[()|*+?.]',
        re.S,
    )

    def __init__(self, text: str) -> None:
        self.rules: dict[str, tuple] = {}
        starts = list(re.finditer(r"^([A-Za-z0-9-]+)\s*::=", text, re.M))
        assert starts, "no rules"
        for i, match in enumerate(starts):
            end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
            tokens = self._tokens(text[match.end() : end])
            node, rest = self._alternatives(tokens)
            assert not rest, f"trailing tokens in {match.group(1)}: {rest}"
            self.rules[match.group(1)] = node
        assert "root" in self.rules
        for name in self._references():
            assert name in self.rules, f"undefined rule {name}"

    def _tokens(self, body: str) -> list[str]:
        tokens, pos = [], 0
        while pos < len(body):
            match = self.TOKEN.match(body, pos)
            assert match, f"cannot read GBNF at {body[pos:pos + 30]!r}"
            pos = match.end()
            token = match.group(0)
            if not token.isspace() and not token.startswith("#"):
                tokens.append(token)
        return tokens

    def _alternatives(self, tokens):
        options = []
        sequence, tokens = self._sequence(tokens)
        options.append(sequence)
        while tokens and tokens[0] == "|":
            sequence, tokens = self._sequence(tokens[1:])
            options.append(sequence)
        return ("alt", options), tokens

    def _sequence(self, tokens):
        items = []
        while tokens and tokens[0] not in ("|", ")"):
            atom, tokens = self._atom(tokens)
            while tokens and (tokens[0] in ("*", "+", "?") or tokens[0].startswith("{")):
                atom = ("rep", atom, *self._counts(tokens[0]))
                tokens = tokens[1:]
            items.append(atom)
        return ("seq", items), tokens

    @staticmethod
    def _counts(token):
        if token == "*":
            return 0, None
        if token == "+":
            return 1, None
        if token == "?":
            return 0, 1
        low, _, high = token.strip("{}").partition(",")
        if "," not in token:
            return int(low), int(low)
        return int(low), int(high) if high.strip() else None

    def _atom(self, tokens):
        token = tokens[0]
        if token == "(":
            node, rest = self._alternatives(tokens[1:])
            assert rest and rest[0] == ")", "unbalanced parenthesis"
            return node, rest[1:]
        if token.startswith('"'):
            return ("lit", self._decode(token[1:-1])), tokens[1:]
        if token.startswith("["):
            return self._char_class(token[1:-1]), tokens[1:]
        if token == ".":
            return ("any",), tokens[1:]
        assert re.fullmatch(r"[A-Za-z0-9-]+", token), f"unexpected token {token!r}"
        return ("ref", token), tokens[1:]

    @staticmethod
    def _chars(text):
        """Decode GBNF escapes into a list of characters."""
        out, i = [], 0
        while i < len(text):
            if text[i] == "\\":
                kind = text[i + 1]
                if kind in "xuU":
                    size = {"x": 2, "u": 4, "U": 8}[kind]
                    out.append(chr(int(text[i + 2 : i + 2 + size], 16)))
                    i += 2 + size
                    continue
                out.append({"n": "\n", "r": "\r", "t": "\t"}.get(kind, kind))
                i += 2
            else:
                out.append(text[i])
                i += 1
        return out

    def _decode(self, text):
        return "".join(self._chars(text))

    def _char_class(self, body):
        negated = body.startswith("^")
        if negated:
            body = body[1:]
        chars = self._chars(body)
        raw_dash = [False] * len(chars)
        # A '-' written plainly between two characters makes a range.
        plain = re.sub(r"\\(x..|u....|U........|.)", "E", body)
        for i, ch in enumerate(plain):
            if ch == "-" and 0 < i < len(plain) - 1:
                raw_dash[i] = True
        ranges, i = [], 0
        while i < len(chars):
            if i + 2 < len(chars) and raw_dash[i + 1]:
                ranges.append((chars[i], chars[i + 2]))
                i += 3
            else:
                ranges.append((chars[i], chars[i]))
                i += 1
        return ("class", negated, ranges)

    def _references(self):
        stack = list(self.rules.values())
        while stack:
            node = stack.pop()
            if node[0] == "ref":
                yield node[1]
            elif node[0] in ("alt", "seq"):
                stack.extend(node[1])
            elif node[0] == "rep":
                stack.append(node[1])

    def matches(self, text: str, rule: str = "root") -> bool:
        self._text, self._memo = text, {}
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 20000))
        try:
            return len(text) in self._ends(("ref", rule), 0)
        finally:
            sys.setrecursionlimit(limit)

    def _ends(self, node, pos) -> frozenset:
        kind = node[0]
        text = self._text
        if kind == "lit":
            return frozenset([pos + len(node[1])]) if text.startswith(node[1], pos) else frozenset()
        if kind == "any":
            return frozenset([pos + 1]) if pos < len(text) else frozenset()
        if kind == "class":
            if pos >= len(text):
                return frozenset()
            inside = any(low <= text[pos] <= high for low, high in node[2])
            return frozenset([pos + 1]) if inside != node[1] else frozenset()
        if kind == "ref":
            key = (node[1], pos)
            if key not in self._memo:
                self._memo[key] = frozenset()
                self._memo[key] = self._ends(self.rules[node[1]], pos)
            return self._memo[key]
        if kind == "alt":
            return frozenset().union(*(self._ends(option, pos) for option in node[1]))
        if kind == "seq":
            current = frozenset([pos])
            for item in node[1]:
                current = frozenset().union(*(self._ends(item, p) for p in current)) if current else current
            return current
        _, item, low, high = node
        result = frozenset([pos]) if low == 0 else frozenset()
        frontier, count, seen = frozenset([pos]), 0, {pos}
        while frontier and (high is None or count < high):
            frontier = frozenset().union(*(self._ends(item, p) for p in frontier))
            count += 1
            if count >= low:
                result |= frontier
            if high is None:
                frontier = frozenset(p for p in frontier if p not in seen)
                seen |= frontier
        return result


def matches(grammar: str, text: str) -> bool:
    return Gbnf(grammar).matches(text)


def test_the_matcher_reads_classes_ranges_and_repetitions():
    grammar = 'root ::= [a-c]{2,3} [^\\x2D] "x"? ("-" item)* \nitem ::= [0-9]+'
    assert matches(grammar, "abz-1-23")
    assert matches(grammar, "cccqx")
    assert not matches(grammar, "a-")
    assert not matches(grammar, "abcd-")


# --------------------------------------------------------------------------- validate_tools


def bad_request(call) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        call()
    assert info.value.status == 400
    return info.value


@pytest.mark.parametrize(
    ("tools", "param"),
    [
        ({"name": "x"}, "tools"),
        ([WEATHER, "nope"], "tools[1]"),
        ([{"type": "retrieval", "function": {"name": "x"}}], "tools[0].type"),
        ([WEATHER, {"type": "function"}], "tools[1].function"),
        ([{"type": "function", "function": {"name": "has space"}}], "tools[0].function.name"),
        ([{"type": "function", "function": {"name": "x" * 65}}], "tools[0].function.name"),
        ([{"type": "function", "function": {"name": 3}}], "tools[0].function.name"),
        ([WEATHER, WEATHER], "tools[1].function.name"),
        ([{"type": "function", "function": {"name": "x", "description": 5}}], "tools[0].function.description"),
        ([{"type": "function", "function": {"name": "x", "parameters": []}}], "tools[0].function.parameters"),
        ([{"type": "function", "function": {"name": "x", "parameters": {"type": "string"}}}], "tools[0].function.parameters"),
        (
            [NOARGS, {"type": "function", "function": {"name": "x", "parameters": {"properties": {"a": {"type": "rainbow"}}}}}],
            "tools[1].function.parameters",
        ),
        (
            [{"type": "function", "function": {"name": "x", "parameters": {"properties": {"a": {"$ref": "https://example.com/s.json"}}}}}],
            "tools[0].function.parameters",
        ),
        ([{"type": "function", "function": {"name": "x", "strict": "yes"}}], "tools[0].function.strict"),
    ],
)
def test_validate_tools_names_the_bad_field(tools, param):
    assert bad_request(lambda: validate_tools(tools)).param == param


def test_validate_tools_normalises():
    tools = validate_tools([WEATHER, NOARGS, {"function": {"name": "s", "strict": True}}])
    assert tools[0] == WEATHER
    assert tools[1] == {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}
    assert tools[2]["function"]["strict"] is True
    assert validate_tools(None) == []
    assert validate_tools([]) == []


# --------------------------------------------------------------------------- validate_tool_choice


def test_validate_tool_choice_modes():
    tools = validate_tools([WEATHER, SEARCH])
    assert validate_tool_choice(None, tools) == ToolChoice("auto")
    assert validate_tool_choice(None, []) == ToolChoice("none")
    assert validate_tool_choice("none", tools) == ToolChoice("none")
    assert validate_tool_choice("required", tools) == ToolChoice("required")
    named = {"type": "function", "function": {"name": "search"}}
    assert validate_tool_choice(named, tools) == ToolChoice("function", "search")


@pytest.mark.parametrize(
    "choice",
    [
        "sometimes",
        5,
        {"type": "function"},
        {"type": "function", "function": {"name": "missing"}},
        {"type": "tool", "function": {"name": "search"}},
    ],
)
def test_validate_tool_choice_rejects(choice):
    tools = validate_tools([WEATHER, SEARCH])
    assert bad_request(lambda: validate_tool_choice(choice, tools)).param == "tool_choice"


def test_required_tool_choice_needs_tools():
    assert bad_request(lambda: validate_tool_choice("required", [])).param == "tool_choice"


# --------------------------------------------------------------------------- tool-call grammars

TOOLS = [WEATHER, SEARCH, COUNT, NOARGS]

# One valid call per format for get_weather, and for count (whose $defs item is an integer).
CALLS = {
    "hermes": (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>',
        '<tool_call>\n{"name": "count", "arguments": {"q": 7}}\n</tool_call>',
        "\n",
    ),
    "hermes_xml": (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
        "<parameter=unit>\nc\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>\n<function=count>\n<parameter=q>\n7\n</parameter>\n</function>\n</tool_call>",
        "\n",
    ),
    "llama3": (
        '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}',
        '{"name": "count", "parameters": {"q": 7}}',
        "\n",
    ),
    "mistral": (
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3}',
        '[TOOL_CALLS]count[CALL_ID]abcDEF123[ARGS]{"q": 7}',
        "",
    ),
    "json": (
        '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}',
        '{"name": "count", "arguments": {"q": 7}}',
        None,
    ),
}
WRONG = {
    "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"days": 3}}\n</tool_call>',
    "hermes_xml": "<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
    "llama3": '{"name": "get_weather", "parameters": {"days": 3}}',
    "mistral": '[TOOL_CALLS]get_weather[ARGS]{"days": 3}',
    "json": '{"name": "get_weather", "arguments": {"days": 3}}',
}


def grammar_for(fmt, mode="required", name=None, **options) -> GrammarSpec:
    spec = tool_call_grammar(validate_tools(TOOLS), ToolChoice(mode, name), fmt, **options)
    assert spec is not None
    return spec


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode", ["auto", "required"])
@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("reasoning", [(False, False), (True, False), (True, True)])
def test_every_tool_grammar_is_accepted_by_llama_cpp(fmt, mode, parallel, reasoning):
    spec = grammar_for(
        fmt, mode, parallel_tool_calls=parallel, reasoning=reasoning[0], starts_in_reasoning=reasoning[1]
    )
    assert grammar_is_valid(spec.grammar)
    Gbnf(spec.grammar)
    assert spec.lazy == (mode == "auto")
    if spec.lazy:
        sampler = lazy_sampler(None, spec)
        assert sampler, "llama.cpp rejected the lazy grammar or its trigger patterns"
        llama_cpp.llama_sampler_free(sampler)
    else:
        assert spec.trigger_patterns == [] and spec.trigger_texts == []


@pytest.mark.parametrize("fmt", FORMATS)
def test_valid_calls_match_and_parse_back(fmt):
    weather, count, separator = CALLS[fmt]
    spec = grammar_for(fmt)
    for text in (weather, count):
        assert matches(spec.grammar, text), text
        parsed = OutputParser(fmt).parse_complete(text)
        assert len(parsed.tool_calls) == 1 and parsed.content is None
    assert not matches(spec.grammar, WRONG[fmt]), "a required argument is missing"
    assert not matches(spec.grammar, weather.replace("get_weather", "get_wether"))
    if separator is not None:
        both = weather + separator + count
        assert matches(spec.grammar, both)
        assert len(OutputParser(fmt).parse_complete(both).tool_calls) == 2
        assert not matches(grammar_for(fmt, parallel_tool_calls=False).grammar, both)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_named_function_is_called_exactly_once(fmt):
    """instructor's named tool_choice came back with the same call twice and "length"."""
    weather, _, separator = CALLS[fmt]
    named = grammar_for(fmt, "function", "get_weather")
    assert matches(named.grammar, weather)
    if separator is not None:
        twice = weather + separator + weather
        assert matches(grammar_for(fmt, "required").grammar, twice), "required allows more calls"
        assert not matches(named.grammar, twice)


def test_json_format_accepts_a_list_when_parallel():
    spec = grammar_for("json")
    text = '[{"name": "ping", "arguments": {}}, {"name": "count", "arguments": {"q": 1}}]'
    assert matches(spec.grammar, text)
    assert not matches(grammar_for("json", parallel_tool_calls=False).grammar, text)


@pytest.mark.parametrize("fmt", FORMATS)
def test_named_function_allows_only_that_function(fmt):
    weather, count, _ = CALLS[fmt]
    spec = grammar_for(fmt, "function", "count")
    assert not spec.lazy
    assert matches(spec.grammar, count)
    assert not matches(spec.grammar, weather)


def test_same_defs_name_in_two_tools_keeps_each_schema():
    spec = grammar_for("hermes")
    search = '<tool_call>\n{"name": "search", "arguments": {"q": "text"}}\n</tool_call>'
    count = '<tool_call>\n{"name": "count", "arguments": {"q": 7}}\n</tool_call>'
    assert matches(spec.grammar, search) and matches(spec.grammar, count)
    assert not matches(spec.grammar, search.replace('"text"', "7"))
    assert not matches(spec.grammar, count.replace("7", '"text"'))


def test_reasoning_block_may_or_must_precede_required_calls():
    weather = CALLS["hermes"][0]
    optional = grammar_for("hermes", reasoning=True).grammar
    assert matches(optional, weather)
    assert matches(optional, "<think>\nI need the weather.\n</think>\n\n" + weather)
    opened = grammar_for("hermes", reasoning=True, starts_in_reasoning=True).grammar
    assert matches(opened, "I need <the> weather.\n</think>\n\n" + weather)
    assert not matches(opened, weather)
    assert not matches(grammar_for("hermes").grammar, "<think>x</think>" + weather)


def test_xml_string_values_may_hold_anything_but_the_closing_tag():
    spec = grammar_for("hermes_xml", "function", "get_weather")
    call = "<tool_call>\n<function=get_weather>\n<parameter=city>\n{}\n</parameter>\n</function>\n</tool_call>"
    assert matches(spec.grammar, call.format("multi\nline <b>/ </param"))
    assert not matches(spec.grammar, call.format("a</parameter>b"))
    assert not matches(spec.grammar, call.replace("<parameter=city>\n{}\n</parameter>\n", ""))


def test_schema_details_the_library_converter_gets_wrong():
    schema = {
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"},
            "sep": {"const": 'a\\"b'},
            "free": {"type": "string", "pattern": "(?i)anything"},
        },
        "required": ["code", "sep"],
    }
    grammar = response_format_grammar({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert grammar_is_valid(grammar)
    assert matches(grammar, '{"code": "AB-123", "sep": "a\\\\\\"b", "free": "whatever"}')
    assert not matches(grammar, '{"code": "AB-12x", "sep": "a\\\\\\"b"}')


def test_schema_whose_root_is_a_reference():
    schema = {
        "$ref": "#/$defs/Args",
        "$defs": {
            "Args": {"type": "object", "properties": {"n": {"type": "integer"}, "sub": {"$ref": "#/$defs/Sub"}}, "required": ["n"]},
            "Sub": {"type": "object", "properties": {"k": {"type": "string"}}, "required": ["k"]},
        },
    }
    tools = validate_tools([{"type": "function", "function": {"name": "f", "parameters": schema}}])
    for fmt in FORMATS:
        assert grammar_is_valid(tool_call_grammar(tools, ToolChoice("required"), fmt).grammar)
    grammar = tool_call_grammar(tools, ToolChoice("required"), "json").grammar
    assert matches(grammar, '{"name": "f", "arguments": {"n": 1, "sub": {"k": "v"}}}')
    assert not matches(grammar, '{"name": "f", "arguments": {"sub": {"k": "v"}}}')


def test_a_property_described_only_in_words_takes_any_value():
    """Claude Code's tools describe some properties with a description and no type; such a
    tool was refused with a 400 (the library knows only `{}` as "any value")."""
    schema = {"type": "object", "properties": {"x": {"description": "anything", "title": "X"}, "n": {"type": "integer"}},
              "required": ["x"]}
    tools = validate_tools([{"type": "function", "function": {"name": "f", "parameters": schema}}])
    for fmt in FORMATS:
        assert grammar_is_valid(tool_call_grammar(tools, ToolChoice("required"), fmt).grammar)
    grammar = tool_call_grammar(tools, ToolChoice("required"), "json").grammar
    for value in ('"text"', "12", '[1, {"a": null}]', "true"):
        assert matches(grammar, '{"name": "f", "arguments": {"x": %s, "n": 1}}' % value)
    assert not matches(grammar, '{"name": "f", "arguments": {"n": 1}}')


def test_no_grammar_for_none_choice_or_format():
    tools = validate_tools(TOOLS)
    assert tool_call_grammar(tools, ToolChoice("none"), "hermes") is None
    assert tool_call_grammar([], ToolChoice("auto"), "hermes") is None
    assert tool_call_grammar(tools, ToolChoice("required"), "none") is None


def trigger_start(pattern: str, text: str) -> int | None:
    """Where llama.cpp starts the lazy grammar as `text` is generated: it tries the pattern
    after every token on the text so far (here: after every character, a token's best
    case), whole with `^...$` patterns, else anywhere; then the first non-empty group."""
    whole = pattern.startswith("^") and pattern.endswith("$")
    for end in range(1, len(text) + 1):
        match = (re.fullmatch if whole else re.search)(pattern, text[:end])
        if match is None:
            continue
        for group in range(1, (match.re.groups or 0) + 1):
            if match.group(group):
                return match.start(group)
        return match.start()
    return None


# Hermes grammars start at the call's head after the marker (the marker alone may be an echo
# of the tool prompt's "<tool_call></tool_call>"), the other formats at the call's start
LAZY_REPLIES = [
    ("hermes", "I will check.\n" + CALLS["hermes"][0], len("I will check.\n") + CALLS["hermes"][0].index("{")),
    ("hermes_xml", "Sure. " + CALLS["hermes_xml"][0], len("Sure. ") + CALLS["hermes_xml"][0].index("<function=")),
    ("llama3", "<|python_tag|>" + CALLS["llama3"][0], len("<|python_tag|>")),
    ("llama3", " \n" + CALLS["llama3"][0], 2),
    ("mistral", "OK." + CALLS["mistral"][0], 3),
    ("json", "\n" + CALLS["json"][0], 1),
]


@pytest.mark.parametrize(("fmt", "reply", "call_at"), LAZY_REPLIES)
def test_lazy_trigger_starts_the_grammar_at_the_call(fmt, reply, call_at):
    spec = grammar_for(fmt, "auto")
    starts = [trigger_start(p, reply) for p in spec.trigger_patterns]
    assert call_at in starts
    assert matches(spec.grammar, reply[call_at:])
    for token in spec.trigger_texts:
        assert reply[call_at:].startswith(token), "a trigger token must be the grammar's first text"


@pytest.mark.parametrize("fmt", ["llama3", "json"])
def test_lazy_trigger_ignores_calls_after_prose_for_whole_reply_formats(fmt):
    spec = grammar_for(fmt, "auto")
    reply = "Here it is: " + CALLS[fmt][0]
    assert all(trigger_start(p, reply) is None for p in spec.trigger_patterns)


# --------------------------------------------------------------------------- response_format


def test_text_response_format_has_no_grammar():
    assert response_format_grammar(None) is None
    assert response_format_grammar({"type": "text"}) is None


def test_json_object_grammar():
    grammar = response_format_grammar({"type": "json_object"})
    assert grammar_is_valid(grammar)
    assert matches(grammar, '{"a": [1, {"b": null}], "c": "d"}')
    assert not matches(grammar, "[1, 2]")
    assert not matches(grammar, "hello")


def test_json_schema_grammar():
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    grammar = response_format_grammar({"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}})
    assert grammar_is_valid(grammar)
    assert matches(grammar, '{"name": "Ann", "age": 31, "tags": ["x"]}')
    assert not matches(grammar, '{"name": "Ann"}')
    assert not matches(grammar, '{"name": "Ann", "age": "31"}')
    thinking = response_format_grammar(
        {"type": "json_schema", "json_schema": {"name": "person", "schema": schema}}, reasoning=True, starts_in_reasoning=True
    )
    assert matches(thinking, 'Fields first.\n</think>\n\n{"name": "Ann", "age": 31}')
    parsed = OutputParser("hermes", reasoning=True, starts_in_reasoning=True).parse_complete(
        'Fields first.\n</think>\n\n{"name": "Ann", "age": 31}'
    )
    assert json.loads(parsed.content) == {"name": "Ann", "age": 31}


def test_json_object_with_schema_extension():
    grammar = response_format_grammar({"type": "json_object", "schema": {"type": "object", "properties": {"x": {"type": "boolean"}}, "required": ["x"]}})
    assert matches(grammar, '{"x": true}')
    assert not matches(grammar, '{"x": 1}')


@pytest.mark.parametrize(
    ("response_format", "param"),
    [
        ("json", "response_format"),
        ({"type": "yaml"}, "response_format.type"),
        ({"type": "json_schema"}, "response_format.json_schema"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": "{}"}}, "response_format.json_schema.schema"),
        ({"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}, "response_format.json_schema.name"),
        ({"type": "json_schema", "json_schema": {"name": "x", "strict": 1}}, "response_format.json_schema.strict"),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "widget"}}}}},
            "response_format.json_schema.schema",
        ),
        ({"type": "json_object", "schema": []}, "response_format.schema"),
    ],
)
def test_response_format_errors_name_the_field(response_format, param):
    assert bad_request(lambda: response_format_grammar(response_format)).param == param


def test_gbnf_literal_escapes():
    assert gbnf_literal('a"b\\c\nd\x01') == '"a\\"b\\\\c\\nd\\x01"'
    literal = gbnf_literal('a"b\n')
    assert matches(f"root ::= {literal}", 'a"b\n')


# --------------------------------------------------------------------------- token-level acceptance


def lazy_sampler(vocab, spec: GrammarSpec, trigger_ids=()):
    patterns = (ctypes.c_char_p * max(1, len(spec.trigger_patterns)))(*[p.encode() for p in spec.trigger_patterns])
    tokens = (llama_cpp.llama_token * max(1, len(trigger_ids)))(*trigger_ids)
    return llama_cpp.llama_sampler_init_grammar_lazy_patterns(
        vocab, spec.grammar.encode(), b"root", patterns, len(spec.trigger_patterns), tokens, len(trigger_ids)
    )


class Vocab:
    """A vocabulary-only llama.cpp model, for running grammars over real tokens."""

    def __init__(self, path: pathlib.Path) -> None:
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        assert self.model, f"could not load {path}"
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.eos = llama_cpp.llama_vocab_eos(self.vocab)

    def tokenize(self, text: str) -> list[int]:
        data = text.encode()
        buffer = (llama_cpp.llama_token * (len(data) + 8))()
        count = llama_cpp.llama_tokenize(self.vocab, data, len(data), buffer, len(buffer), False, True)
        assert count >= 0
        return list(buffer[:count])

    def allowed(self, sampler, token: int) -> bool:
        data = (llama_cpp.llama_token_data * 1)()
        data[0].id, data[0].logit, data[0].p = token, 0.0, 0.0
        array = llama_cpp.llama_token_data_array(
            data=ctypes.cast(data, ctypes.POINTER(llama_cpp.llama_token_data)), size=1, selected=-1, sorted=False
        )
        llama_cpp.llama_sampler_apply(sampler, ctypes.byref(array))
        return not math.isinf(data[0].logit)

    def accepts(self, sampler, text: str) -> bool:
        """Feed `text` token by token; True if every token and then end-of-text are allowed."""
        try:
            for token in self.tokenize(text):
                if not self.allowed(sampler, token):
                    return False
                llama_cpp.llama_sampler_accept(sampler, token)
            return self.allowed(sampler, self.eos)
        finally:
            llama_cpp.llama_sampler_free(sampler)

    def strict(self, grammar: str):
        sampler = llama_cpp.llama_sampler_init_grammar(self.vocab, grammar.encode(), b"root")
        assert sampler
        return sampler


@pytest.fixture(scope="module")
def vocab(qwen35_vocab):
    model = Vocab(qwen35_vocab)
    yield model
    llama_cpp.llama_model_free(model.model)


@pytest.mark.parametrize("fmt", FORMATS)
def test_llama_cpp_samples_valid_calls_through_required_grammar(vocab, fmt):
    weather, count, _ = CALLS[fmt]
    spec = grammar_for(fmt)
    assert vocab.accepts(vocab.strict(spec.grammar), weather)
    assert vocab.accepts(vocab.strict(spec.grammar), count)
    assert not vocab.accepts(vocab.strict(spec.grammar), WRONG[fmt])


@pytest.mark.parametrize(("fmt", "reply", "call_at"), LAZY_REPLIES)
def test_llama_cpp_lazy_grammar_waits_for_the_call(vocab, fmt, reply, call_at):
    spec = grammar_for(fmt, "auto")
    assert vocab.accepts(lazy_sampler(vocab.vocab, spec), reply)
    wrong = reply[:call_at] + WRONG[fmt]
    assert not vocab.accepts(lazy_sampler(vocab.vocab, spec), wrong)
    marker_ids = [vocab.tokenize(text) for text in spec.trigger_texts]
    single = [ids[0] for ids in marker_ids if len(ids) == 1]
    if single:  # the marker is a special token in this vocabulary
        assert vocab.accepts(lazy_sampler(vocab.vocab, spec, single), reply)


def test_llama_cpp_lazy_grammar_leaves_prose_alone(vocab):
    spec = grammar_for("hermes", "auto")
    assert vocab.accepts(lazy_sampler(vocab.vocab, spec), "No tools needed: <tool_call is not a call.")


@pytest.mark.parametrize("fmt", ["hermes", "hermes_xml"])
def test_an_echoed_tool_prompt_marker_does_not_start_the_grammar(vocab, fmt):
    """A small model echoing the tool prompt's "<tool_call></tool_call>" completed the trigger
    with a token such as "></", whose tail the grammar could not take: llama.cpp threw and the
    server aborted. The grammar starts only at a call's head (a known function's name)."""
    spec = grammar_for(fmt, "auto")
    echo = "Return calls within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>}\n</tool_call>"
    assert all(trigger_start(p, echo) is None for p in spec.trigger_patterns)
    assert vocab.accepts(lazy_sampler(vocab.vocab, spec), echo)
    assert vocab.accepts(lazy_sampler(vocab.vocab, spec), echo + "\n" + CALLS[fmt][0])  # a real call after it


def test_llama_cpp_response_format_grammar(vocab):
    grammar = response_format_grammar({"type": "json_object"}, reasoning=True, starts_in_reasoning=True)
    assert vocab.accepts(vocab.strict(grammar), 'Think.\n</think>\n\n{"ok": true}')
    assert not vocab.accepts(vocab.strict(grammar), '{"ok": true}')


# --------------------------------------------------------------------------- bounds and lengths


def schema_grammar(schema: dict) -> str:
    return response_format_grammar({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})


def random_bound(rng: random.Random) -> int:
    scale = rng.choice([10, 100, 10**4, 10**9, 2**53])
    return rng.randint(-scale, scale)


def integer_case(rng: random.Random) -> tuple[dict, int | None, int | None]:
    """A schema with random integer bounds and the first and last integer it allows."""
    schema: dict = {"type": "integer"}
    a, b = sorted([random_bound(rng), random_bound(rng)])
    first = last = None
    low_kind = rng.choice(["minimum", "exclusiveMinimum", "minimum-draft4", "fraction", None])
    high_kind = rng.choice(["maximum", "exclusiveMaximum", "maximum-draft4", "fraction", None])
    if low_kind is None and high_kind is None:
        high_kind = "maximum"
    if low_kind == "minimum":
        schema["minimum"], first = a, a
    elif low_kind == "exclusiveMinimum":
        schema["exclusiveMinimum"], first = a, a + 1
    elif low_kind == "minimum-draft4":
        schema.update(minimum=a, exclusiveMinimum=True)
        first = a + 1
    elif low_kind == "fraction":
        schema["minimum"], first = a + 0.5, a + 1
    if high_kind == "maximum":
        schema["maximum"], last = b, b
    elif high_kind == "exclusiveMaximum":
        schema["exclusiveMaximum"], last = b, b - 1
    elif high_kind == "maximum-draft4":
        schema.update(maximum=b, exclusiveMaximum=True)
        last = b - 1
    elif high_kind == "fraction":
        schema["maximum"], last = b - 0.5, b - 1
    return schema, first, last


def integer_samples(rng: random.Random, first: int | None, last: int | None) -> set[int]:
    samples = {0, 1, -1, 9, 10, -10, 99, 100, 2**53, -(2**53)}
    for bound in (first, last):
        if bound is not None:
            samples |= {bound + k for k in range(-3, 4)}
            digits = len(str(abs(bound)))
            samples |= {10 ** (digits - 1), 10**digits - 1, 10**digits, -(10**digits)}
    low = first if first is not None else (last or 0) - 10**6
    high = last if last is not None else (first or 0) + 10**6
    if low <= high:
        samples |= {rng.randint(low, high) for _ in range(6)}
    samples |= {rng.randint(-(10**17), 10**17) for _ in range(3)}
    return samples


def within_open_digit_cap(value, first, last):
    """Whether `value` has few enough digits for an open side of the range (16, or the bound's)."""
    if value >= 0 and last is None:
        return len(str(value)) <= max(16, len(str(max(first or 0, 0))))
    if value < 0 and first is None:
        return len(str(-value)) <= max(16, len(str(-last if last is not None and last < 0 else 1)))
    return True


def test_integer_bounds_allow_exactly_the_integers_in_range():
    rng = random.Random(20240611)
    unsatisfiable = 0
    for _ in range(70):
        schema, first, last = integer_case(rng)
        if first is not None and last is not None and first > last:
            with pytest.raises(InvalidRequest):
                schema_grammar(schema)
            unsatisfiable += 1
            continue
        grammar = schema_grammar(schema)
        assert grammar_is_valid(grammar), schema
        parsed = Gbnf(grammar)
        for value in integer_samples(rng, first, last):
            expected = (first is None or value >= first) and (last is None or value <= last)
            expected = expected and within_open_digit_cap(value, first, last)
            assert parsed.matches(str(value)) == expected, (schema, value)
        inside = first if first is not None else last
        assert parsed.matches(str(inside))
        for text in ("0" + str(abs(inside)), "-0", "00", "+" + str(inside), f"{inside}.0", f"{inside}e0", "-", ""):
            assert not parsed.matches(text), (schema, text)
    assert unsatisfiable < 35


def test_an_open_side_keeps_the_plain_digit_bound():
    """hermes-agent's `timeout` ({"type": "integer", "minimum": 1}) ran to 190 digits: an open
    side is capped at 16 digits like a plain integer, numbers too."""
    timeout = Gbnf(schema_grammar({"type": "integer", "minimum": 1}))
    assert timeout.matches("1") and timeout.matches("9" * 16)
    assert not timeout.matches("1" + "0" * 16) and not timeout.matches("0")
    below = Gbnf(schema_grammar({"type": "integer", "maximum": 5}))
    assert below.matches("-" + "9" * 16) and not below.matches("-" + "1" * 17) and not below.matches("6")
    ratio = Gbnf(schema_grammar({"type": "number", "exclusiveMinimum": 0}))
    assert ratio.matches("9" * 16 + ".5") and not ratio.matches("1" + "0" * 16) and not ratio.matches("0")
    big = Gbnf(schema_grammar({"type": "integer", "minimum": 10**20}))
    assert big.matches(str(10**20)) and big.matches("9" * 21) and not big.matches("1" + "0" * 21)


def test_integer_range_examples():
    grammar = Gbnf(schema_grammar({"type": "integer", "minimum": 1, "maximum": 10}))
    assert [n for n in range(-20, 30) if grammar.matches(str(n))] == list(range(1, 11))
    assert not grammar.matches("1000000000000000")
    crossing = Gbnf(schema_grammar({"type": "integer", "exclusiveMinimum": -105, "exclusiveMaximum": 1200}))
    assert [n for n in range(-2000, 2000) if crossing.matches(str(n))] == list(range(-104, 1200))
    negative = Gbnf(schema_grammar({"type": "integer", "maximum": -7}))
    assert negative.matches("-7") and negative.matches("-" + "9" * 16) and not negative.matches("-1" + "0" * 16)
    assert not negative.matches("-6") and not negative.matches("0") and not negative.matches("-07")
    natural = Gbnf(schema_grammar({"type": "integer", "minimum": 0}))
    assert natural.matches("0") and natural.matches("9" * 16) and not natural.matches("1" + "0" * 16)
    assert not natural.matches("-1") and not natural.matches("-0") and not natural.matches("01")
    single = Gbnf(schema_grammar({"type": "integer", "minimum": 2**53, "maximum": 2**53}))
    assert single.matches(str(2**53)) and not single.matches(str(2**53 - 1)) and not single.matches(str(2**53 + 1))


def number_samples(rng: random.Random, bounds: list[Decimal]) -> set[Decimal]:
    samples = {Decimal(0), Decimal(1), Decimal(-1), Decimal("0.5"), Decimal("-0.5"), Decimal("123.456")}
    for bound in bounds:
        for places in range(4):
            step = Decimal(1).scaleb(-places)
            samples |= {bound - step, bound, bound + step, bound + step / 2, bound - step / 2}
        samples.add(bound + Decimal("1E-16") * rng.choice([-1, 1]))
    if len(bounds) == 2:
        width = bounds[1] - bounds[0]
        samples |= {bounds[0] + width * Decimal(rng.random()).quantize(Decimal("0.001")) for _ in range(4)}
    return samples


def decimal_text(value: Decimal) -> str:
    text = format(value, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def test_number_bounds_allow_exactly_the_plain_decimals_in_range():
    rng = random.Random(7)
    for _ in range(40):
        a, b = sorted(Decimal(rng.randint(-3000, 3000)).scaleb(-rng.randint(0, 3)) for _ in range(2))
        low_key = rng.choice(["minimum", "exclusiveMinimum", None])
        high_key = rng.choice(["maximum", "exclusiveMaximum", None])
        if low_key is None and high_key is None:
            low_key = "minimum"
        schema = {"type": "number"}
        if low_key:
            schema[low_key] = float(a)
        if high_key:
            schema[high_key] = float(b)
        if low_key and high_key and a == b and "exclusive" in low_key + high_key:
            with pytest.raises(InvalidRequest):
                schema_grammar(schema)
            continue
        grammar = schema_grammar(schema)
        assert grammar_is_valid(grammar), schema
        parsed = Gbnf(grammar)
        for value in number_samples(rng, [a, b] if low_key and high_key else [a if low_key else b]):
            expected = True
            if low_key:
                expected &= value > a if low_key == "exclusiveMinimum" else value >= a
            if high_key:
                expected &= value < b if high_key == "exclusiveMaximum" else value <= b
            assert parsed.matches(decimal_text(value)) == expected, (schema, value)
        assert not parsed.matches("1e1") and not parsed.matches("01.5") and not parsed.matches("1.")


def test_number_bounds_within_one_unit_and_trailing_zeros():
    grammar = Gbnf(schema_grammar({"type": "number", "minimum": 0.1, "maximum": 0.9}))
    assert all(grammar.matches(text) for text in ("0.1", "0.10", "0.5", "0.9", "0.9000"))
    assert not any(grammar.matches(text) for text in ("0.09", "0.91", "0", "1", "0.900001"))
    strict = Gbnf(schema_grammar({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}))
    assert strict.matches("0.000001") and strict.matches("0.999")
    assert not any(strict.matches(text) for text in ("0", "0.000", "1", "1.0", "-0.5"))


def test_bounds_apply_in_tool_calls_and_type_lists():
    tool = {
        "type": "function",
        "function": {
            "name": "fetch",
            "parameters": {
                "type": "object",
                "properties": {
                    "limit": {"type": "integer", "minimum": 1, "maximum": 10},
                    "page": {"type": ["integer", "null"], "minimum": 0},
                    "mode": {"type": ["string", "null"], "enum": ["a", "b", None]},
                },
                "required": ["limit"],
            },
        },
    }
    tools = validate_tools([tool])
    hermes = tool_call_grammar(tools, ToolChoice("required"), "hermes").grammar
    call = '<tool_call>\n{"name": "fetch", "arguments": {"limit": %s}}\n</tool_call>'
    assert matches(hermes, call % "10")
    assert not matches(hermes, call % "1000000000000000")
    assert not matches(hermes, call % "0")
    assert matches(hermes, call % '7, "page": null, "mode": "b"')
    assert matches(hermes, call % '7, "page": 0')
    assert not matches(hermes, call % '7, "page": -1')
    assert not matches(hermes, call % '7, "mode": "c"')
    xml = tool_call_grammar(tools, ToolChoice("required"), "hermes_xml").grammar
    xml_call = "<tool_call>\n<function=fetch>\n<parameter=limit>\n%s\n</parameter>\n</function>\n</tool_call>"
    assert matches(xml, xml_call % "3") and not matches(xml, xml_call % "11")


def test_integer_enum_and_const():
    grammar = Gbnf(schema_grammar({"type": "integer", "enum": [2, 30, -4]}))
    assert [n for n in range(-50, 50) if grammar.matches(str(n))] == [-4, 2, 30]
    assert Gbnf(schema_grammar({"const": 42})).matches("42")
    assert not Gbnf(schema_grammar({"const": 42})).matches("420")


def test_string_lengths_and_array_counts():
    short = Gbnf(schema_grammar({"type": "string", "minLength": 2, "maxLength": 4}))
    assert [n for n in range(7) if short.matches(json.dumps("é" * n))] == [2, 3, 4]
    assert short.matches('"a\\"b"')  # an escape is one character
    for size in (2000, 5000):  # past llama.cpp's repetition limit for one counted run
        long = schema_grammar({"type": "string", "maxLength": size})
        assert grammar_is_valid(long)
        assert Gbnf(long).matches(json.dumps("x" * size)) and not Gbnf(long).matches(json.dumps("x" * (size + 1)))
    exact = schema_grammar({"type": "string", "minLength": 2500, "maxLength": 2500})
    assert grammar_is_valid(exact) and Gbnf(exact).matches(json.dumps("y" * 2500))
    assert not Gbnf(exact).matches(json.dumps("y" * 2499))
    items = {"type": "integer", "maximum": 5}
    counted = Gbnf(schema_grammar({"type": "array", "items": items, "minItems": 1, "maxItems": 3}))
    assert [n for n in range(6) if counted.matches(json.dumps([5] * n))] == [1, 2, 3]
    assert not counted.matches("[6]")
    untyped = Gbnf(schema_grammar({"type": "array", "minItems": 2}))
    assert untyped.matches('[1, "a", {"b": null}]') and not untyped.matches("[1]")
    assert Gbnf(schema_grammar({"type": "array", "maxItems": 0})).matches("[]")


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "integer", "minimum": 5, "maximum": 4},
        {"type": "integer", "exclusiveMinimum": 4, "exclusiveMaximum": 5},
        {"type": "integer", "minimum": 4.2, "maximum": 4.8},
        {"type": "number", "exclusiveMinimum": 1, "maximum": 1},
        {"type": "string", "minLength": 3, "maxLength": 2},
        {"type": "array", "minItems": 3, "maxItems": 2},
    ],
)
def test_unsatisfiable_bounds_are_the_clients_error(schema):
    assert bad_request(lambda: schema_grammar(schema)).param == "response_format.json_schema.schema"


def test_llama_cpp_samples_only_integers_in_range(vocab):
    limit = {"type": "integer", "minimum": 1, "maximum": 10}
    grammar = schema_grammar({"type": "object", "properties": {"limit": limit}, "required": ["limit"]})
    assert vocab.accepts(vocab.strict(grammar), '{"limit": 10}')
    assert not vocab.accepts(vocab.strict(grammar), '{"limit": 1000000000000000}')
    assert not vocab.accepts(vocab.strict(grammar), '{"limit": 0}')


# --------------------------------------------------------------------------- limits

SCHEMA_PARAM = "response_format.json_schema.schema"


def tool_taking(parameters: dict) -> list[dict]:
    return [{"type": "function", "function": {"name": "f", "parameters": parameters}}]


def nested(depth: int, leaf: dict, wrap) -> dict:
    schema = leaf
    for _ in range(depth):
        schema = wrap(schema)
    return schema


@pytest.mark.parametrize(
    ("schema", "field"),
    [
        ({"type": "string", "maxLength": 10**8}, "maxLength"),
        ({"type": "string", "maxLength": 10**7}, "maxLength"),
        ({"type": "string", "maxLength": 1e8}, "maxLength"),
        ({"type": "string", "minLength": 10**7}, "minLength"),
        ({"type": "array", "minItems": 10**6}, "minItems"),
        ({"type": "array", "items": {"type": "string"}, "maxItems": 10**6}, "maxItems"),
        ({"type": "object", "properties": {"s": {"type": "string", "maxLength": 10**8}}}, "properties.s.maxLength"),
        ({"type": "integer", "maximum": 10**400}, "maximum"),
        ({"type": "number", "minimum": -(10**50) - 1}, "minimum"),
    ],
)
def test_huge_max_length_is_rejected_not_crashing(schema, field):
    error = bad_request(lambda: schema_grammar(schema))
    assert error.param == f"{SCHEMA_PARAM}.{field}"
    tools = tool_taking({"type": "object", "properties": {"a": schema}})
    error = bad_request(lambda: validate_tools(tools))
    assert error.param == f"tools[0].function.parameters.properties.a.{field}"


def test_nested_arrays_with_large_bounds_are_rejected_by_their_total():
    leaf = {"type": "string", "maxLength": MAX_COUNT}
    schema = nested(2, leaf, lambda items: {"type": "array", "maxItems": MAX_COUNT, "items": items})
    assert bad_request(lambda: schema_grammar(schema)).param == f"{SCHEMA_PARAM}.items.items.maxLength"
    tools = tool_taking({"type": "object", "properties": {"a": schema}})
    param = "tools[0].function.parameters.properties.a.items.items.maxLength"
    assert bad_request(lambda: validate_tools(tools)).param == param


@pytest.mark.parametrize("kind", ["array", "object", "anyOf"])
def test_deep_nesting_is_rejected(kind):
    wraps = {
        "array": lambda inner: {"type": "array", "items": inner},
        "object": lambda inner: {"type": "object", "properties": {"x": inner}},
        "anyOf": lambda inner: {"anyOf": [inner, {"type": "null"}]},
    }
    schema = nested(200, {"type": "string"}, wraps[kind])
    error = bad_request(lambda: schema_grammar(schema))
    assert error.param.startswith(SCHEMA_PARAM + ".") and "levels deep" in error.message
    assert bad_request(lambda: validate_tools(tool_taking({"type": "object", "properties": {"a": schema}})))
    fine = nested(MAX_SCHEMA_DEPTH - 2, {"type": "string"}, wraps[kind])
    assert grammar_is_valid(schema_grammar(fine))


def test_number_bounds_keep_every_digit():
    """Bounds are exact decimals: negating one must not round it to 28 digits."""
    grammar = Gbnf(schema_grammar({"type": "number", "maximum": -(10**35) - 1}))
    assert grammar.matches(str(-(10**35) - 1)) and grammar.matches(str(-(10**35) - 2))
    assert not grammar.matches(str(-(10**35)))


def test_bounds_at_the_limits_give_small_grammars():
    """The largest accepted counts and bounds still give grammars far inside the compile limits."""
    for schema in (
        {"type": "string", "maxLength": MAX_COUNT},
        {"type": "string", "minLength": MAX_COUNT, "maxLength": MAX_COUNT},
        {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": MAX_COUNT},
        {"type": "number", "minimum": 5e-324, "maximum": 1.7976931348623157e308},
        {"type": "integer", "minimum": -(2**127), "maximum": 2**128 - 1},
        {"type": "integer", "minimum": int("9" * MAX_BOUND_SIGNIFICANT_DIGITS) * 10 ** (MAX_BOUND_DIGITS - 41)},
    ):
        grammar = schema_grammar(schema)
        shape = measure(grammar)
        assert shape.size < 100_000, schema
        assert shape.repetitions <= 2 * MAX_COUNT + 2_000 and shape.nesting < 400, schema
        assert grammar_is_valid(grammar), schema


def test_a_total_of_lengths_past_the_grammar_limit_is_rejected_across_tools():
    count = MAX_GRAMMAR_REPETITIONS // (2 * MAX_COUNT) + 1
    tools = [
        {"type": "function", "function": {"name": f"f{i}", "parameters": string_object(MAX_COUNT)}} for i in range(count)
    ]
    validated = validate_tools(tools)  # each tool alone is within the limits
    error = bad_request(lambda: tool_call_grammar(validated, ToolChoice("required"), "hermes"))
    assert error.param == "tools" and "repetitions" in error.message


def string_object(max_length: int) -> dict:
    return {"type": "object", "properties": {"s": {"type": "string", "maxLength": max_length}}, "required": ["s"]}


def test_too_many_properties_are_rejected():
    schema = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(MAX_OBJECT_PROPERTIES + 1)}}
    assert bad_request(lambda: schema_grammar(schema)).param == f"{SCHEMA_PARAM}.properties"


def test_a_type_named_twice_is_converted_once():
    """Each alternative of a type list is converted with the schema's other keywords, so a
    type named twice per level doubled the work per level (the rules grew without bound)."""
    depth = MAX_SCHEMA_DEPTH - 2
    schema = nested(depth, {"type": "string"}, lambda inner: {"type": ["array", "array"], "items": inner})
    grammar = schema_grammar(schema)
    assert measure(grammar).size < 50_000 and grammar_is_valid(grammar)
    assert matches(grammar, "[" * depth + '"a"' + "]" * depth)
    assert not matches(grammar, "[" * (depth - 1) + '"a"' + "]" * (depth - 1))


def test_references_used_twice_per_level_stop_at_the_visit_limit():
    """Each definition copies the properties of the next one twice (allOf of two references),
    so converting visits 2^depth subschemas while the schema stays small."""
    depth = 24
    defs = {f"d{i}": {"type": "object", "properties": {"v": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}] * 2}}} for i in range(depth)}
    defs[f"d{depth}"] = {"type": "object", "properties": {"leaf": {"type": "string"}}}
    schema = {"$defs": defs, "type": "object", "properties": {"root": {"$ref": "#/$defs/d0"}}}
    error = bad_request(lambda: schema_grammar(schema))
    assert error.param == SCHEMA_PARAM and "subschemas" in error.message


@pytest.mark.parametrize(
    ("pattern", "problem"),
    [
        ("^[A-Z]{2}-\\d{3}$", None),
        ("^(\\+|00)?[0-9]{7,15}$", None),
        ("^([a-z0-9]+(-[a-z0-9]+)*\\.)+[a-z]{2,}$", None),
        ("^((25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)\\.){3}(25[0-5]|2[0-4]\\d|[1-9]?\\d)$", None),
        ("^((a{0,30}){0,30}){0,30}$", "empty"),
        ("^(a|)+$", "empty"),
        ("^(x*y?)*$", "empty"),
        ("a{0,100000000}", "count"),
        ("^((a|b){1,10}c){0,1000}$", "combinations"),
    ],
)
def test_pattern_repetitions_that_would_explode_are_found(pattern, problem):
    found = repetition_problem(pattern)
    assert (found is None) if problem is None else (problem in found)


def test_a_pattern_that_would_explode_is_dropped_not_compiled():
    """llama.cpp follows every empty match of a repeated, nullable group one by one: this
    pattern hangs the sampler on its first character, so the string stays unconstrained."""
    grammar = schema_grammar({"type": "string", "pattern": "^((a{0,30}){0,30}){0,30}$"})
    assert matches(grammar, '"anything at all"')
    assert measure(grammar).size < 2_000


def test_grammars_past_the_compile_limits_are_refused_before_llama_cpp():
    """The parser recurses once per group: this nesting overflowed its stack (a segfault)."""
    deep = "root ::= " + '("a" ' * 20_000 + ")?" * 20_000 + "\n"
    assert "nests" in check_grammar(None, GrammarSpec(deep))
    counted = "root ::= " + " ".join(['"a"{0,1999}'] * (MAX_GRAMMAR_REPETITIONS // 1999 + 1)) + "\n"
    assert "repetitions" in check_grammar(None, GrammarSpec(counted))
    assert "bytes" in check_grammar(None, GrammarSpec('root ::= "' + "a" * MAX_GRAMMAR_BYTES + '"\n'))
    rules = "root ::= r0\n" + "".join(f'r{i} ::= "a"\n' for i in range(MAX_GRAMMAR_RULES + 1))
    assert "rules" in check_grammar(None, GrammarSpec(rules))
    literal = 'root ::= "(((" [(] "{99999999}" \n'  # structure inside literals and classes does not count
    assert measure(literal).nesting == 0 and measure(literal).repetitions == 0


def test_open_strings_and_arrays_stop_at_their_caps():
    """A string or array whose schema leaves its length open is capped (OPEN_STRING_CHARS,
    OPEN_ARRAY_ITEMS), and the capped rule stays small enough for llama.cpp."""
    from warmslot.server.gbnf.converter import _capped
    from warmslot.server.gbnf.limits import OPEN_ARRAY_ITEMS, OPEN_STRING_CHARS

    for low, high in ((0, 2500), (3, 2003), (1200, 4000)):
        run = Gbnf(f'root ::= {_capped("x", low, high)}\nx ::= "a"')
        for n in {0, 1, low - 1, low, 999, 1000, 1001, 1999, 2000, 2001, high - 1, high, high + 1}:
            if n >= 0:
                assert run.matches("a" * n) == (low <= n <= high), (low, high, n)
    for schema in ({"type": "string"}, {"type": "string", "minLength": 2}, {"type": "array"},
                   {"type": "array", "items": {"type": "integer"}, "minItems": 1}, {}):
        grammar = schema_grammar(schema)
        assert grammar_is_valid(grammar), schema
        assert "*" not in grammar.split("object ::=")[0] + "".join(
            line for line in grammar.splitlines() if line.startswith(("string", "array", "root")))
    text = Gbnf(schema_grammar({"type": "string", "minLength": 2}))
    assert text.matches('"' + "a" * OPEN_STRING_CHARS + '"') and not text.matches('"' + "a" * (OPEN_STRING_CHARS + 1) + '"')
    assert OPEN_ARRAY_ITEMS == 10_000
