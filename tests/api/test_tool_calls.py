"""Output parsing: reasoning split, content and streamed tool calls for every format."""

import json
import random
import re

import pytest

from warmslot.server.prompt.template import detect_format, detect_reasoning, prompt_opens_reasoning
from warmslot.server.output.parsed import ContentDelta, ParsedMessage, ReasoningDelta, ToolCall, ToolCallDelta, collect, new_call_id
from warmslot.server.output.parser import OutputParser


def counter_ids():
    """A deterministic id factory: call_0, call_1, ..."""
    numbers = iter(range(10**6))
    return lambda: f"call_{next(numbers)}"


def make(fmt="hermes", **options):
    return OutputParser(fmt, id_factory=counter_ids(), **options)


def run_parser(chunks, fmt="hermes", truncated=False, **options):
    """The parser after streaming `chunks`, and the events it gave."""
    parser = make(fmt, **options)
    events = []
    for chunk in chunks:
        events += parser.feed(chunk)
    return parser, events + parser.finish(truncated)


def run_chunks(chunks, fmt="hermes", **options):
    return run_parser(chunks, fmt, **options)[1]


def kept(parser, events, stream_arguments):
    """What a client keeps of a stream: its deltas, less the calls sent in part that failed."""
    return collect(events, drop=parser.failed if stream_arguments else ())


def streamed_message(chunks, fmt="hermes", **options):
    """The stream's message, the same whether arguments stream or calls are held whole."""
    messages = []
    for stream_arguments in (False, True):
        parser, events = run_parser(chunks, fmt, stream_arguments=stream_arguments, **options)
        check_call_deltas(events, parser.failed if stream_arguments else ())
        messages.append(kept(parser, events, stream_arguments))
    assert messages[0] == messages[1], chunks
    return messages[0]


def check_call_deltas(events, failed=()):
    """Streamed call deltas are OpenAI-shaped and the fragments of every call that stands join
    into valid JSON."""
    seen: dict[int, list[str]] = {}
    for event in events:
        if not isinstance(event, ToolCallDelta):
            continue
        if event.index not in seen:
            assert event.id and event.name, "the first delta of a call carries id and name"
            assert event.index == len(seen), "calls are numbered in order"
            seen[event.index] = [event.arguments]
        else:
            assert event.id is None and event.name is None
            seen[event.index].append(event.arguments)
    message = collect(events)
    for index, fragments in seen.items():
        assert "".join(fragments) == message.tool_calls[index].arguments
        if index not in failed:
            assert isinstance(json.loads(message.tool_calls[index].arguments), dict)


def assert_stream_equivalent(text, expected, fmt="hermes", **options):
    """Whole, char-by-char and every two-chunk split all give `expected`."""
    assert make(fmt, **options).parse_complete(text) == expected
    assert streamed_message(list(text), fmt, **options) == expected
    for cut in range(1, len(text)):
        got = streamed_message([text[:cut], text[cut:]], fmt, **options)
        assert got == expected, f"split at {cut}: {text[:cut]!r} | {text[cut:]!r}"


def message(content=None, reasoning=None, calls=()):
    return ParsedMessage(content, reasoning, [ToolCall(*call) for call in calls])


# --------------------------------------------------------------------------- hermes

WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2.5e1, true, null], "note": "a \\"q\\" \\u00e9"}}'
WEATHER_ARGS = '{"city": "Paris", "days": [1, 2.5e1, true, null], "note": "a \\"q\\" \\u00e9"}'


def test_hermes_single_call_in_any_chunking():
    text = f"<tool_call>\n{WEATHER}\n</tool_call>"
    assert_stream_equivalent(text, message(calls=[("call_0", "get_weather", WEATHER_ARGS)]))


def test_hermes_content_before_several_calls():
    text = (
        "Let me look that up.\n\n"
        f"<tool_call>\n{WEATHER}\n</tool_call>\n"
        '<tool_call>\n{"name": "search", "arguments": {"q": "x"}}\n</tool_call>'
    )
    expected = message(
        "Let me look that up.",
        calls=[("call_0", "get_weather", WEATHER_ARGS), ("call_1", "search", '{"q": "x"}')],
    )
    assert_stream_equivalent(text, expected)


def test_hermes_arguments_stream_before_the_call_closes():
    text = f"<tool_call>\n{WEATHER}\n</tool_call>"
    parser = make(stream_arguments=True)
    fragments_before_close = []
    for i, ch in enumerate(text):
        for event in parser.feed(ch):
            if isinstance(event, ToolCallDelta) and i < text.index("</tool_call>"):
                fragments_before_close.append(event.arguments)
    parser.finish()
    assert len(fragments_before_close) > 10
    assert "".join(fragments_before_close).startswith('{"city": "Paris"')


def test_hermes_partial_marker_is_held_back():
    parser = make()
    assert parser.feed("Hello <tool_c") == [ContentDelta("Hello")]
    assert parser.feed("all>\n") == []
    events = parser.feed('{"name": "f", "arguments": {}}\n</tool_call>') + parser.finish()
    assert collect(events) == message(calls=[("call_0", "f", "{}")])


def test_hermes_text_that_only_looks_like_a_marker_is_released():
    assert_stream_equivalent("a <tool_cal b", message("a <tool_cal b"))


def test_hermes_malformed_json_comes_back_as_content():
    text = 'Checking. <tool_call>\n{"name": get_weather, "arguments": {}}\n</tool_call> done'
    assert_stream_equivalent(text, message(text))


def test_hermes_non_call_json_comes_back_as_content():
    text = '<tool_call>\n{"tool": "x"}\n</tool_call>'
    assert_stream_equivalent(text, message(text))


def test_hermes_unterminated_call_before_arguments_is_content():
    text = 'Sure <tool_call>\n{"name": "get_w'
    assert_stream_equivalent(text, message(text))


def test_hermes_call_cut_inside_arguments_is_never_closed():
    for text in ('<tool_call>\n{"name": "f", "arguments": {"q": "abc", "n": 1', '<tool_call>\n{"name": "f", "arguments": {"q": "abc", "li'):
        assert_stream_equivalent(text, message(""))


def test_hermes_call_without_closing_tag_is_complete():
    text = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n'
    assert_stream_equivalent(text, message(calls=[("call_0", "f", '{"a": 1}')]))


def test_hermes_arguments_before_name_are_read_whole():
    text = '<tool_call>\n{"arguments": {"a": 1}, "name": "f"}\n</tool_call>'
    assert_stream_equivalent(text, message(calls=[("call_0", "f", '{"a": 1}')]))


def test_hermes_arguments_given_as_json_string():
    text = '<tool_call>\n{"name": "f", "arguments": "{\\"a\\": 1}"}\n</tool_call>'
    assert_stream_equivalent(text, message(calls=[("call_0", "f", '{"a": 1}')]))


def test_hermes_raw_newline_in_string_is_escaped():
    text = '<tool_call>\n{"name": "f", "arguments": {"code": "a\nb"}}\n</tool_call>'
    assert_stream_equivalent(text, message(calls=[("call_0", "f", '{"code": "a\\nb"}')]))


def test_hermes_xml_parameters():
    text = (
        "I'll check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
        '<parameter=days>\n3\n</parameter>\n<parameter=opts>\n{"x": [1]}\n</parameter>\n</function>\n</tool_call>'
    )
    args = '{"city": "New York", "days": 3, "opts": {"x": [1]}}'
    expected = message("I'll check.", calls=[("call_0", "get_weather", args)])
    assert_stream_equivalent(text, expected)
    assert_stream_equivalent(text, expected, "hermes_xml")


def test_hermes_xml_string_parameters_stay_text_when_tools_say_so():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"properties": {"zip": {"type": "string"}}}}}]
    text = "<tool_call>\n<function=f>\n<parameter=zip>\n01234\n</parameter>\n</function>\n</tool_call>"
    parsed = make("hermes_xml", tools=tools).parse_complete(text)
    assert parsed.tool_calls[0].arguments == '{"zip": "01234"}'
    assert make("hermes_xml").parse_complete(text.replace("01234", "1234")).tool_calls[0].arguments == '{"zip": 1234}'


def test_hermes_malformed_xml_is_content():
    text = "<tool_call>\n<function=f>\n<parameter=a>\n1\n</function>\n</tool_call>"
    assert_stream_equivalent(text, message(text))


# --------------------------------------------------------------------------- reasoning


def test_think_block_is_split_streamed_and_whole():
    text = "<think>\nLet me think.\nStep 2.\n</think>\n\nThe answer is 4."
    expected = message("The answer is 4.", "Let me think.\nStep 2.")
    assert_stream_equivalent(text, expected, reasoning=True)


def test_reasoning_then_tool_call():
    text = f"<think>\nNeed weather.\n</think>\n\n<tool_call>\n{WEATHER}\n</tool_call>"
    expected = message(None, "Need weather.", [("call_0", "get_weather", WEATHER_ARGS)])
    assert_stream_equivalent(text, expected, reasoning=True)


def test_starts_in_reasoning():
    text = "The user asks.\n</think>\n\nHi!"
    assert_stream_equivalent(text, message("Hi!", "The user asks."), reasoning=True, starts_in_reasoning=True)


def test_starts_in_reasoning_skips_a_repeated_open_tag():
    text = "<think>\nhm\n</think>\nok"
    assert_stream_equivalent(text, message("ok", "hm"), reasoning=True, starts_in_reasoning=True)


def test_unclosed_reasoning_stays_reasoning():
    text = "thinking forever </thi"
    assert_stream_equivalent(text, message("", "thinking forever </thi"), reasoning=True, starts_in_reasoning=True)


def test_tool_call_ends_reasoning_for_hermes():
    text = "I should call it.\n<tool_call>\n<function=f>\n</function>\n</tool_call>"
    expected = message(None, "I should call it.", [("call_0", "f", "{}")])
    assert_stream_equivalent(text, expected, "hermes_xml", reasoning=True, starts_in_reasoning=True)


def test_think_tags_are_content_without_reasoning():
    text = "<think>x</think>y"
    assert_stream_equivalent(text, message(text), reasoning=False)


def test_output_not_starting_with_think_is_content():
    assert_stream_equivalent("Hello <think>x</think>", message("Hello <think>x</think>"), reasoning=True)


def test_in_reasoning_tracks_the_think_block():
    parser = make(reasoning=True, starts_in_reasoning=True)
    parser.feed("abc")
    assert parser.in_reasoning
    parser.feed("</think>")
    assert not parser.in_reasoning


# --------------------------------------------------------------------------- tools disabled


def test_tools_disabled_leaves_calls_in_content():
    text = f"<tool_call>\n{WEATHER}\n</tool_call>"
    assert_stream_equivalent(text, message(text), tools_enabled=False)
    assert_stream_equivalent(text, message(text), "none")


def test_tools_disabled_still_splits_reasoning():
    text = "<think>r</think>c <tool_call>"
    assert_stream_equivalent(text, message("c <tool_call>", "r"), reasoning=True, tools_enabled=False)


# --------------------------------------------------------------------------- llama3


def test_llama3_single_call():
    text = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
    assert_stream_equivalent(text, message(calls=[("call_0", "get_weather", '{"city": "Paris"}')]), "llama3")


def test_llama3_python_tag_and_several_calls():
    text = '<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "arguments": {}}\n{"name": "c", "parameters": {"y": [2]}}'
    expected = message(calls=[("call_0", "a", '{"x": 1}'), ("call_1", "b", "{}"), ("call_2", "c", '{"y": [2]}')])
    assert_stream_equivalent(text, expected, "llama3")


def test_llama3_plain_reply_is_content():
    text = 'The JSON {"name": "x", "parameters": {}} is an example.'
    assert_stream_equivalent(text, message(text), "llama3")


def test_llama3_json_that_is_not_a_call_is_content():
    text = '{"result": 42, "ok": true}'
    assert_stream_equivalent(text, message(text), "llama3")


def test_llama3_malformed_json_is_content():
    text = '<|python_tag|>{"name": "a" "parameters": {}}'
    assert_stream_equivalent(text, message(text), "llama3")


def test_llama3_text_after_calls_is_content():
    text = '{"name": "a", "parameters": {}}\nDone.'
    assert_stream_equivalent(text, message("Done.", calls=[("call_0", "a", "{}")]), "llama3")


# --------------------------------------------------------------------------- mistral


def test_mistral_array_form_keeps_given_ids():
    text = '[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}, "id": "abcDEF123"}, {"name": "b", "arguments": {}}]'
    expected = message(calls=[("abcDEF123", "a", '{"x": 1}'), ("call_0", "b", "{}")])
    assert_stream_equivalent(text, expected, "mistral")


def test_mistral_named_form_with_and_without_call_id():
    text = 'Sure.[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris"}[TOOL_CALLS]noop[ARGS]{}'
    expected = message("Sure.", calls=[("a1b2c3d4e", "get_weather", '{"city": "Paris"}'), ("call_0", "noop", "{}")])
    assert_stream_equivalent(text, expected, "mistral")


def test_mistral_named_form_streams_arguments():
    events = run_chunks(list('[TOOL_CALLS]f[ARGS]{"a": "bcdef"}'), "mistral", stream_arguments=True)
    fragments = [e for e in events if isinstance(e, ToolCallDelta) and e.id is None]
    assert len(fragments) > 3


def test_mistral_malformed_is_content():
    for text in ("[TOOL_CALLS] I cannot do that.", '[TOOL_CALLS][{"name": 1}]', "[TOOL_CALLS]f[ARGS]nope"):
        assert_stream_equivalent(text, message(text), "mistral")


def test_mistral_cut_call_is_never_closed():
    text = '[TOOL_CALLS]f[ARGS]{"a": [1, 2'
    assert_stream_equivalent(text, message(""), "mistral")


# --------------------------------------------------------------------------- json


def test_json_bare_object():
    text = '{"name": "f", "arguments": {"a": 1}}'
    assert_stream_equivalent(text, message(calls=[("call_0", "f", '{"a": 1}')]), "json")


def test_json_fenced_list_and_tool_calls_wrapper():
    expected = message(calls=[("call_0", "f", '{"a": 1}'), ("call_1", "g", "{}")])
    listed = '```json\n[{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]\n```'
    assert_stream_equivalent(listed, expected, "json")
    wrapped = '{"tool_calls": [{"function": {"name": "f", "arguments": "{\\"a\\": 1}"}}, {"name": "g"}]}'
    assert_stream_equivalent(wrapped, expected, "json")


def test_json_non_call_and_text_are_content():
    for text in ('{"answer": 42}', "Just text.", "```python\nprint(1)\n```", '{"name": "f", "arguments": 3}'):
        assert_stream_equivalent(text, message(text), "json")


def test_json_text_after_call_is_content():
    text = '```json\n{"name": "f", "arguments": {}}\n```\nCalling f now.'
    assert_stream_equivalent(text, message("Calling f now.", calls=[("call_0", "f", "{}")]), "json")


# --------------------------------------------------------------------------- robustness and ids


FUZZ_PIECES = [
    "<tool_call>", "</tool_call>", "\n", "{", "}", "[", "]", '"', ":", ",", " ", "\\", "name", "arguments",
    '"name": "f"', '"arguments": ', '{"name": "f", "arguments": {', '{"name": "g", "parameters": {"a": ',
    "<function=f>", "<parameter=a>", "</parameter>", "</function>", "<think>", "</think>", "[TOOL_CALLS]",
    "[ARGS]", "[CALL_ID]", "abcdefghi", "<|python_tag|>", "1", "true", "x", "```", "json", ";", "<", "[TOOL", "<tool",
]


@pytest.mark.parametrize("fmt", ["hermes", "hermes_xml", "llama3", "mistral", "json", "none"])
@pytest.mark.parametrize("reasoning", [(False, False), (True, False), (True, True)])
def test_random_inputs_never_raise_and_stream_identically(fmt, reasoning):
    options = {"reasoning": reasoning[0], "starts_in_reasoning": reasoning[1]}
    rng = random.Random(f"{fmt}{reasoning}")
    for _ in range(40):
        text = "".join(rng.choice(FUZZ_PIECES) for _ in range(rng.randint(1, 14)))
        whole = make(fmt, **options).parse_complete(text)
        for chunks in [list(text)] + [[text[:cut], text[cut:]] for cut in range(1, len(text))]:
            assert streamed_message(chunks, fmt, **options) == whole, (text, chunks)


def test_text_after_an_abandoned_marker_is_read_again():
    text = '<tool_call> oops <tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    assert_stream_equivalent(text, message("<tool_call> oops", calls=[("call_0", "f", "{}")]))
    text = "[TOOL_CALLS] no [TOOL_CALLS]f[ARGS]{}"
    assert_stream_equivalent(text, message("[TOOL_CALLS] no", calls=[("call_0", "f", "{}")]), "mistral")


def test_default_ids_look_like_openai_ids():
    call_id = new_call_id()
    assert re.fullmatch(r"call_[A-Za-z0-9]{24}", call_id)
    assert new_call_id() != call_id
    parsed = OutputParser("hermes").parse_complete('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>')
    assert re.fullmatch(r"call_[A-Za-z0-9]{24}", parsed.tool_calls[0].id)


def test_collect_merges_deltas():
    events = [
        ReasoningDelta("a"), ReasoningDelta("b"), ContentDelta("c"),
        ToolCallDelta(0, "id0", "f", ""), ToolCallDelta(0, None, None, "{}"),
    ]
    assert collect(events) == message("c", "ab", [("id0", "f", "{}")])
    assert collect([]) == message("")


def test_unknown_format_is_rejected():
    with pytest.raises(ValueError):
        OutputParser("xml")


# --------------------------------------------------------------------------- detection

QWEN25_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n<tools>' }}...{{- '<tool_call>\\n{\"name\": <function-name>, "
    "\"arguments\": <args-json-object>}\\n</tool_call>' }}{%- endif %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
QWEN3_TEMPLATE = QWEN25_TEMPLATE.replace(
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}",
    "{%- set reasoning_content = content.split('</think>')[0].split('<think>')[-1] %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}",
)
QWEN35_TEMPLATE = (
    "{{- '<tool_call>\\n<function=example_function_name>\\n<parameter=example_parameter_1>\\nvalue_1\\n</parameter>' }}"
    "{{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content + '\\n</think>\\n\\n' + content }}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{- '<think>\\n' }}{%- endif %}{%- endif %}"
)
LLAMA31_TEMPLATE = (
    "{{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.' }}"
    "{%- if builtin_tools is defined %}{{- \"<|python_tag|>\" + tool_call.name + \".call(\" }}{%- endif %}"
    "{%- if message.role == \"ipython\" %}{%- endif %}"
)
LLAMA32_TEMPLATE = LLAMA31_TEMPLATE.replace('{{- \"<|python_tag|>\" + tool_call.name + \".call(\" }}', "")
MISTRAL_TEMPLATE = "{{- '[TOOL_CALLS]' + tool_call.function.name }}{{- '[ARGS]' + arguments }}"
R1_TEMPLATE = "{%- if add_generation_prompt %}{{'<｜Assistant｜><think>\\n'}}{%- endif %}"


@pytest.mark.parametrize(
    ("template", "arch", "fmt"),
    [
        (QWEN25_TEMPLATE, "qwen2", "hermes"),
        (QWEN3_TEMPLATE, "qwen3", "hermes"),
        (QWEN35_TEMPLATE, "qwen35", "hermes_xml"),
        (LLAMA31_TEMPLATE, "llama", "llama3"),
        (LLAMA32_TEMPLATE, "llama", "llama3"),
        (MISTRAL_TEMPLATE, "llama", "mistral"),
        ("{{ messages }}", "llama", "hermes"),
        (None, "qwen3moe", "hermes"),
        (None, "gemma3", "hermes"),
    ],
)
def test_detect_format(template, arch, fmt):
    # `arch` names the model each template comes from; only the template decides
    assert detect_format(template) == fmt


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (QWEN25_TEMPLATE, (False, False)),
        (QWEN3_TEMPLATE, (True, False)),
        (QWEN35_TEMPLATE, (True, True)),
        (R1_TEMPLATE, (True, True)),
        (None, (False, False)),
    ],
)
def test_detect_reasoning(template, expected):
    assert detect_reasoning(template) == expected


def test_prompt_opens_reasoning():
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    history = "<|im_start|>assistant\n<think>\nold\n</think>\n\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert not prompt_opens_reasoning(history)
    assert prompt_opens_reasoning(history + "<think>\n")


def test_output_cut_inside_the_closing_tag_of_a_complete_call_is_not_content():
    for cut in ("\n</tool_call", "\n</tool", "\n<", "\n"):
        text = '<tool_call>\n{"name": "x", "arguments": {"a": 1}}' + cut
        message = OutputParser("hermes").parse_complete(text)
        assert message.content is None, (cut, message)
        assert [(c.name, c.arguments) for c in message.tool_calls] == [("x", '{"a": 1}')]


# --------------------------------------------------------------------------- cut and invalid calls

FINAL_ANSWER = [{"type": "function", "function": {
    "name": "final_answer",
    "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
}}]

# One whole call per format, with where its arguments start in the text.
WHOLE_CALLS = {
    "hermes": '<tool_call>\n{"name": "final_answer", "arguments": {"answer": "Sunny, 21 C"}}\n</tool_call>',
    "hermes_xml": "<tool_call>\n<function=final_answer>\n<parameter=answer>\nSunny, 21 C\n</parameter>\n</function>\n</tool_call>",
    "llama3": '<|python_tag|>{"name": "final_answer", "parameters": {"answer": "Sunny, 21 C"}}',
    "mistral": '[TOOL_CALLS]final_answer[ARGS]{"answer": "Sunny, 21 C"}',
    "mistral_array": '[TOOL_CALLS][{"name": "final_answer", "arguments": {"answer": "Sunny, 21 C"}}]',
    "json": '{"name": "final_answer", "arguments": {"answer": "Sunny, 21 C"}}',
}
ARGUMENTS_TEXT = '{"answer": "Sunny, 21 C"}'


def format_of(name):
    return "mistral" if name == "mistral_array" else name


@pytest.mark.parametrize("name", sorted(WHOLE_CALLS))
def test_a_call_cut_anywhere_is_never_passed_off_as_whole(name):
    """Every prefix of a call, cut by max_tokens: the whole reply has the call only once its
    arguments closed, and the stream never sends argument text the model did not write."""
    text, fmt = WHOLE_CALLS[name], format_of(name)
    args_end = text.index(ARGUMENTS_TEXT) + len(ARGUMENTS_TEXT) if ARGUMENTS_TEXT in text else None
    for size in range(1, len(text)):
        prefix = text[:size]
        parser = make(fmt, tools=FINAL_ANSWER)
        whole = parser.parse_complete(prefix, truncated=True)
        assert all(json.loads(call.arguments) == {"answer": "Sunny, 21 C"} for call in whole.tool_calls), prefix
        if args_end is not None and size < args_end:
            assert whole.tool_calls == [] and whole.content == "", prefix
        for stream_arguments in (False, True):
            streamed, events = run_parser(list(prefix), fmt, truncated=True, tools=FINAL_ANSWER, stream_arguments=stream_arguments)
            sent = "".join(e.arguments for e in events if isinstance(e, ToolCallDelta))
            assert ARGUMENTS_TEXT.startswith(sent) or sent == ARGUMENTS_TEXT, (prefix, sent)
            if not stream_arguments:
                assert sent in ("", ARGUMENTS_TEXT), "a held call is sent whole or not at all"
            assert kept(streamed, events, stream_arguments) == whole, prefix
            assert streamed.cut == parser.cut and streamed.cut_index == parser.cut_index
        if whole.tool_calls:
            assert not parser.cut and parser.cut_index is None and parser.failed == []


@pytest.mark.parametrize("fmt, text", [
    ("hermes", '<tool_call>\n{"name": "final_answer", "arguments": {"answer":'),
    ("llama3", '{"name": "final_answer", "parameters": {"answer": "Sun'),
    ("mistral", '[TOOL_CALLS]final_answer[ARGS]{"answer": "Sun'),
])
def test_a_streamed_call_cut_in_its_arguments_is_named_and_not_closed(fmt, text):
    parser, events = run_parser([text], fmt, truncated=True, tools=FINAL_ANSWER, stream_arguments=True)
    assert parser.cut and parser.cut_index == 0 and parser.failed == [0]
    sent = "".join(e.arguments for e in events if isinstance(e, ToolCallDelta))
    assert text.endswith(sent) and sent.startswith("{"), "only the model's own text is sent"
    held, events = run_parser([text], fmt, truncated=True, tools=FINAL_ANSWER)
    assert events == [] and held.cut and held.cut_index == 0, "by default a cut call is never sent"
    assert make(fmt, tools=FINAL_ANSWER).parse_complete(text, truncated=True) == message("")


@pytest.mark.parametrize("fmt, text", [
    ("hermes_xml", "<tool_call>\n<function=final_answer>\n<parameter=answer>\nSun"),
    ("json", '{"name": "final_answer", "arguments": {"answer": "Sun'),
    ("mistral", '[TOOL_CALLS][{"name": "final_answer", "arguments": {"answer": "Sun'),
])
def test_a_call_read_whole_and_cut_sends_nothing(fmt, text):
    parser, events = run_parser([text], fmt, truncated=True, tools=FINAL_ANSWER)
    assert events == [] and parser.cut and parser.cut_index is None


def test_a_failed_call_leaves_no_gap_in_the_numbers():
    bad = '<tool_call>\n{"name": "final_answer", "arguments": {"answer": 5}}\n</tool_call>\n'
    good = '<tool_call>\n{"name": "final_answer", "arguments": {"answer": "a"}}\n</tool_call>'
    parser, events = run_parser(list(bad + good), tools=FINAL_ANSWER)
    assert [e.index for e in events if isinstance(e, ToolCallDelta)] == [0]
    assert collect(events) == make(tools=FINAL_ANSWER).parse_complete(bad + good)
    assert len(collect(events).tool_calls) == 1


def test_a_cut_second_call_keeps_the_first():
    first = '<tool_call>\n{"name": "final_answer", "arguments": {"answer": "a"}}\n</tool_call>\n'
    text = first + '<tool_call>\n{"name": "final_answer", "arguments": {"answer": "b'
    parser = make(tools=FINAL_ANSWER)
    parsed = parser.parse_complete(text, truncated=True)
    assert [c.arguments for c in parsed.tool_calls] == ['{"answer": "a"}']
    assert parser.cut_index == 1 and parser.failed == [1]


def test_a_call_left_open_by_a_stop_is_cut_too():
    parser = make(tools=FINAL_ANSWER)
    parsed = parser.parse_complete('<tool_call>\n{"name": "final_answer", "arguments": {"answer": "Su')
    assert parsed.tool_calls == [] and parser.cut and parser.cut_index == 0


@pytest.mark.parametrize("fmt, text", [
    ("hermes", '<tool_call>\n{"name": "final_answer", "arguments": {"answer": 5}}\n</tool_call>'),
    ("hermes", '<tool_call>\n{"name": "final_answer", "arguments": {}}\n</tool_call>'),
    ("llama3", '{"name": "final_answer", "parameters": {"reply": "x"}}'),
    ("mistral", '[TOOL_CALLS]final_answer[ARGS]{"answer": null}'),
])
def test_a_streamed_call_invalid_for_its_schema_fails(fmt, text):
    parser, events = run_parser(list(text), fmt, tools=FINAL_ANSWER)
    assert parser.failed == [0] and not parser.cut and parser.cut_index is None
    assert not any(isinstance(e, ToolCallDelta) for e in events), "an invalid call is never sent"
    assert make(fmt, tools=FINAL_ANSWER).parse_complete(text).tool_calls == []


@pytest.mark.parametrize("fmt, text", [
    ("hermes_xml", "<tool_call>\n<function=final_answer>\n<parameter=reply>\nx\n</parameter>\n</function>\n</tool_call>"),
    ("json", '{"name": "final_answer", "arguments": {"answer": 5}}'),
    ("mistral", '[TOOL_CALLS][{"name": "final_answer", "arguments": {"answer": 5}}]'),
])
def test_a_whole_call_invalid_for_its_schema_is_content(fmt, text):
    assert_stream_equivalent(text, message(text), fmt, tools=FINAL_ANSWER)


def test_a_call_whose_json_breaks_fails_and_the_rest_is_content():
    text = '<tool_call>\n{"name": "final_answer", "arguments": {"answer": "a" oops}\n</tool_call>'
    parser, events = run_parser(list(text), tools=FINAL_ANSWER, stream_arguments=True)
    assert parser.failed == [0] and not parser.cut
    assert "".join(e.arguments for e in events if isinstance(e, ToolCallDelta)) == '{"answer": "a" '
