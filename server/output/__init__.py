"""Streaming parsers that split model output into reasoning, content and tool calls.

An `OutputParser` (`parser.py`) is fed the generated text piece by piece (`feed`) and answers
with events in the shape of OpenAI's streamed deltas: `ContentDelta`, `ReasoningDelta` and
`ToolCallDelta` (`events.py`). `finish` flushes whatever was held back. Feeding the same text in any
chunking yields the same aggregated message, and `parse_complete` is exactly
"feed everything, then finish, then aggregate", so streamed and non-streamed answers agree.

Tool-call formats (`FORMATS`):

- ``hermes``: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` (Hermes,
  Qwen2.5, Qwen3); inside ``<tool_call>`` the XML form
  ``<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>`` is accepted too.
- ``hermes_xml``: the same markers where the model is prompted for the XML form (Qwen3-Coder,
  Qwen3.5). Parsing is identical to ``hermes``; the name exists so grammars can build the XML form.
- ``llama3``: the whole reply is ``{"name": ..., "parameters": {...}}`` (or ``"arguments"``),
  optionally after ``<|python_tag|>``, several separated by ``;`` or newlines.
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}]`` and
  ``[TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...}`` (``[CALL_ID]`` optional), possibly repeated.
- ``json``: the whole reply, optionally fenced with ```` ```json ````, is a call object, a list of
  them, or ``{"tool_calls": [...]}``.
- ``none``: no tool calls.

Text that could still be the start of a call marker is held back until decided; text of a
call never reaches content. A call that turns out malformed before its name and arguments
were recognised, or that is read whole and is not valid for its tool, comes back verbatim as
content. A call stands only when its arguments closed in the model's own text and validate
against its tool's parameters (`validation`); nothing is ever added to close arguments the
model left open (raw control characters inside strings are written as escapes). By default a
call is sent whole once it stands, so a stream never carries part of a call that is then cut;
with `stream_arguments` a JSON call's arguments are sent as the model writes them. One that is
cut short, breaks or is invalid is listed in the parser's `failed` (the one the end of output
cut is its `cut_index`) and is never part of the whole message; after a break the rest of the
text becomes content.

Modules: `markers` (marker texts and format names, importable on their own), `events`,
`json_scanner` (JSON syntax, character by character), `sink` (where layers put events),
`validation` (arguments against the tool's schema), `json_calls` (call objects and a streaming
reader of one), one module per format (`hermes`,
`llama3`, `mistral`, `json_reply` with the plain layer) and `parser`.
"""
