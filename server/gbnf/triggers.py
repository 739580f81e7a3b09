"""Where a lazy tool-call grammar (`tool_choice` "auto") starts: one trigger pattern per format.

How llama.cpp runs the patterns (``llama_grammar_accept_impl`` in src/llama-grammar.cpp, as
vendored in llama-cpp-python 0.3.36): after every accepted token it tries each pattern (a
std::regex, ECMAScript) on *all* the text generated so far, with ``regex_match`` when the
pattern starts with ``^`` and ends with ``$``, else with ``regex_search``. On a match the
grammar starts at the first capture group, and the text from there *to the end of the text*
is replayed into it, unfiltered. Text the grammar cannot take throws a C++ exception out of
``llama_sampler_accept``, and the process aborts.

So every pattern here:

- starts the grammar only at a call's head: the call's opening and a known function's name
  (``{"name": "get_weather"``, ``<function=get_weather>``, ``[TOOL_CALLS]get_weather``),
  never at a bare marker, which a small model may write anywhere (echoing the tool prompt's
  ``<tool_call></tool_call>``, or ``[TOOL_CALLS]`` in prose);
- ends with ``$`` after a short tail: what the grammar takes right after the head (a comma,
  ``"arguments"``, a colon, and the grammar's own bounded whitespace), or any start of it.
  The token that completes a head may carry more text (``"}``, ``"\\n``, ``>\\n<``): the
  pattern then matches nothing, and never will at that place, since the match must end
  where the text ends. That call is left unconstrained (the output parser still reads it);
  nothing unfiltered that the grammar cannot take ever reaches it.

What a pattern admits from its capture group to its end is thus a start of the grammar's
own language (`tests/engine/test_lazy_triggers.py` feeds adversarial token streams through real
llama.cpp lazy grammars to hold that). The patterns scan the whole generated text after
every token, as any trigger pattern does; they have no unbounded repetition inside the
match, so std::regex's backtracking stays short.
"""

from __future__ import annotations

from ..output.markers import HERMES_OPEN, MISTRAL_ARGS, MISTRAL_CALL_ID, MISTRAL_CALLS

SP = r"[ \t\n]{0,2}"  # the grammars' `sp`: the whitespace they allow between a call's JSON tokens
GAP = r"[ \t\r\n]{0,4}"  # their `gap`: between a Hermes marker and the call
# whitespace before a whole-reply call (llama3, json): bounded, since std::regex recurses
# once per character of a repetition and a model may write thousands of blanks
LEADING = r"\s{0,16}"
_SPECIAL = set("\\^$.*+?()[]{}|/")
_CONTROL = {"\n": r"\n", "\t": r"\t", "\r": r"\r"}


def escape(text: str) -> str:
    """`text` as an ECMAScript regex literal (only the syntax characters escaped: std::regex
    refuses some of the identity escapes Python's re.escape writes)."""
    return "".join("\\" + ch if ch in _SPECIAL else _CONTROL.get(ch, ch) for ch in text)


def _proper_starts(literal: str) -> str:
    """A regex for every proper start of `literal`, the empty one included."""
    out = ""
    for ch in reversed(literal[:-1]):
        out = f"(?:{escape(ch)}{out})?"
    return out


def starts_of(*parts: str) -> str:
    """A regex for every start of the text `parts` spell, the empty one and the whole
    included. A part is a literal, or `SP` (the grammars' bounded whitespace)."""
    if not parts:
        return ""
    head, rest = parts[0], parts[1:]
    if head is SP:
        return SP + starts_of(*rest)
    return f"(?:{escape(head)}{starts_of(*rest)}|{_proper_starts(head)})"


def _names(names: list[str]) -> str:
    return "(?:" + "|".join(escape(n) for n in names) + ")"


def _json_head(names: list[str], key: str) -> str:
    """``{"name": "NAME"`` as the grammars write it (`tools._header`), then any start of
    ``, "KEY": `` (the arguments come after, constrained)."""
    head = r"\{" + SP + '"name"' + SP + ":" + SP + '"' + _names(names) + '"'
    return head + starts_of(SP, ",", SP, f'"{key}"', SP, ":", SP)


def call_head_pattern(format: str, names: list[str], parallel: bool) -> str:
    """The trigger pattern of a lazy grammar in `format` over the functions `names`. Its
    capture group starts where the format's lazy grammar root starts (see `tools`)."""
    if format == "hermes":  # the grammar starts after the marker, at the call
        return escape(HERMES_OPEN) + GAP + "(" + _json_head(names, "arguments") + ")$"
    if format == "hermes_xml":
        return escape(HERMES_OPEN) + GAP + "(<function=" + _names(names) + ">" + starts_of("\n") + ")$"
    if format == "llama3":  # the whole reply is the calls (after an optional python tag)
        return "^" + LEADING + "(?:" + escape("<|python_tag|>") + ")?" + LEADING + "(" + _json_head(names, "parameters") + ")$"
    if format == "json":  # the whole reply is a call, or a list of them
        opening = r"(?:\[" + SP + ")?" if parallel else ""
        return "^" + LEADING + "(" + opening + _json_head(names, "arguments") + ")$"
    if format == "mistral":  # the marker, then a list of JSON calls or NAME[CALL_ID]...[ARGS]
        array = r"\[" + SP + _json_head(names, "arguments")
        named = _names(names) + "(?:" + starts_of(MISTRAL_CALL_ID) + "|" + starts_of(MISTRAL_ARGS) + ")"
        return "(" + escape(MISTRAL_CALLS) + "(?:" + array + "|" + named + "))$"
    raise ValueError(f"no lazy grammar for the tool call format {format!r}")
