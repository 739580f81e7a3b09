"""Grammars that enforce `tool_choice`, one builder per tool-call format.

Each tool's parameter schema gets its own rules under the prefix ``t<i>`` (`GrammarRules.schema`).

A lazy grammar (``tool_choice`` "auto") constrains nothing until its trigger pattern matches
the generated text at a call's head; `triggers.py` says how llama.cpp runs the patterns and
why each one starts only at a head and ends where the text ends. Once the grammar is
complete the stacks are empty and only end-of-generation tokens pass, so a lazy tool grammar
ends the reply after its last call. Non-lazy grammars start at the first generated token;
when a model reasons first they can let a think block through (`reasoning`,
`starts_in_reasoning`), otherwise the constraint would forbid the reasoning.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from warmslot.slots import GrammarSpec, check_grammar

from ..errors import InvalidRequest
from ..output.markers import FORMATS, HERMES_CLOSE, HERMES_FORMATS, HERMES_OPEN, MISTRAL_ARGS, MISTRAL_CALL_ID, MISTRAL_CALLS
from .rules import GrammarRules, with_reasoning
from .text import gbnf_literal
from .triggers import GAP, SP, call_head_pattern

if TYPE_CHECKING:
    from ..request.constraints import ToolChoice


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
    "required": not lazy; the whole reply is one or more calls (exactly one without
    `parallel_tool_calls`), the reply free to end after each, after an optional think block
    when the model reasons. A named function: the same, with exactly one call, then the end.
    "none", no tools, or the "none" format: None.
    """
    if format not in FORMATS:
        raise ValueError(f"unknown tool call format {format!r}")
    if choice.mode == "none" or not tools or format == "none":
        return None
    selected = [
        (i, tool["function"])
        for i, tool in enumerate(tools)
        if (choice.mode != "function" or tool["function"]["name"] == choice.name)
        and (choice.allowed is None or tool["function"]["name"] in choice.allowed)
    ]
    grammar = GrammarRules()
    lazy = choice.mode == "auto"
    # a forced Hermes call is written exactly as the tool prompt and the renderer write it,
    # so that a history echoing the call back re-tokenizes to the same prefix
    builder = _hermes_canonical if format == "hermes" and not lazy else _FORMAT_BUILDERS[format]
    # a named function is called exactly once, so the reply ends after it: otherwise a small
    # model may repeat the same call until max_tokens
    parallel = parallel_tool_calls and choice.mode != "function"
    body = builder(grammar, selected, parallel)
    if lazy and format in HERMES_FORMATS:  # the trigger starts it at the call, after the marker
        grammar.add("root", _after_marker(grammar, parallel))
    elif lazy:
        grammar.add("root", body)
    else:
        grammar.add("root", with_reasoning(grammar, body, reasoning, starts_in_reasoning))
    # NOTE: no trigger texts (tokens): a trigger token starts the grammar at a bare marker
    patterns = [call_head_pattern(format, [f["name"] for _, f in selected], parallel)] if lazy else []
    spec = GrammarSpec(grammar.text(), lazy=lazy, trigger_patterns=patterns)
    error = check_grammar(None, spec)
    if error is not None:
        raise InvalidRequest(f"the tools give a grammar that cannot be used: {error}", param="tools")
    return spec


def _after_marker(grammar: GrammarRules, parallel: bool) -> str:
    """The Hermes calls from the first call's head on (the trigger matched its marker and head)."""
    first = f"call gap {gbnf_literal(HERMES_CLOSE)}"
    return grammar.add("calls-after-marker", f"{first} (gap tool-call)*" if parallel else first)


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


def _spacing(grammar: GrammarRules) -> None:
    """Whitespace rules shared by the call formats (bounded, so sampling cannot run away).
    The same text is a GBNF rule and the trigger patterns' regex (`triggers`)."""
    grammar.add("sp", SP)
    grammar.add("gap", GAP)


def _json_calls(grammar: GrammarRules, functions: list[tuple[int, dict[str, Any]]], key: str, extra: str = "") -> str:
    """A rule for one JSON call object of any of `functions`, arguments under `key`."""
    _spacing(grammar)
    alternatives = []
    for i, function in functions:
        args = grammar.schema(function["parameters"], f"t{i}", f"tools[{i}].function.parameters")
        alternatives.append(grammar.add(f"call-{i}", f'{_header(function["name"], key)} {args} {extra}"}}"'))
    return grammar.add("call", " | ".join(alternatives))


def _repeat(grammar: GrammarRules, item: str, separator: str, parallel: bool) -> str:
    return grammar.add("calls", f"{item} ({separator} {item})*" if parallel else item)


def _hermes(grammar: GrammarRules, functions: list[tuple[int, dict[str, Any]]], parallel: bool) -> str:
    call = _json_calls(grammar, functions, "arguments")
    block = grammar.add("tool-call", f"{gbnf_literal(HERMES_OPEN)} gap {call} gap {gbnf_literal(HERMES_CLOSE)}")
    return _repeat(grammar, block, "gap", parallel)


def _hermes_canonical(grammar: GrammarRules, functions: list[tuple[int, dict[str, Any]]], parallel: bool) -> str:
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


def _llama3(grammar: GrammarRules, functions: list[tuple[int, dict[str, Any]]], parallel: bool) -> str:
    call = _json_calls(grammar, functions, "parameters")
    return _repeat(grammar, call, r"[;\n] sp", parallel)


def _json(grammar: GrammarRules, functions: list[tuple[int, dict[str, Any]]], parallel: bool) -> str:
    call = _json_calls(grammar, functions, "arguments")
    if not parallel:
        return call
    return grammar.add("calls", f'{call} | "[" sp {call} ("," sp {call})* sp "]"')


def _mistral(grammar: GrammarRules, functions: list[tuple[int, dict[str, Any]]], parallel: bool) -> str:
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


def _hermes_xml(grammar: GrammarRules, functions: list[tuple[int, dict[str, Any]]], parallel: bool) -> str:
    _spacing(grammar)
    alternatives = [_xml_function(grammar, i, function) for i, function in functions]
    call = grammar.add("call", " | ".join(alternatives))
    block = grammar.add("tool-call", f"{gbnf_literal(HERMES_OPEN)} gap {call} gap {gbnf_literal(HERMES_CLOSE)}")
    return _repeat(grammar, block, "gap", parallel)


def _xml_function(grammar: GrammarRules, i: int, function: dict[str, Any]) -> str:
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


def _xml_parameter(grammar: GrammarRules, i: int, n: int, key: str, schema: dict[str, Any]) -> str:
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
