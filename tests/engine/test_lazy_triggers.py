"""A lazy tool-call grammar never takes unfiltered text it cannot parse.

llama.cpp replays the text from a trigger's match to the end of the generated text into a
lazy grammar, unfiltered; text the grammar cannot take throws out of `llama_sampler_accept`
and aborts the process. The token that completes a trigger may carry such text: `"}` after
a function's name, `><` after `<function=NAME`, `]:` after `[TOOL_CALLS`, `{}` or `[]` at the
start of a reply. Each case below feeds a token stream through a real llama.cpp lazy grammar
(the format's own grammar and trigger patterns, the Qwen3.5 vocabulary) in a child process,
as sampling would: a token the grammar forbids once it has started is never sampled, so the
feed stops there. The child must not abort; and after a missed head, a later call still
starts the grammar.
"""

import json
import os
import subprocess
import sys

import pytest

from warmslot.server.request.constraints import ToolChoice, validate_tools
from warmslot.server.gbnf.tools import tool_call_grammar

pytestmark = pytest.mark.model

TOOLS = validate_tools([
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
])

# The child: for each stream, a fresh lazy grammar sampler is fed `pieces` (each tokenized
# on its own; the last must be one token, the one that completes a head) then `after`. It
# prints a line before each stream (so an abort names it) and one with where the grammar
# first forbade a token (null: never; "not one token": the vocabulary splits the last piece).
FEED = r"""
import llama_cpp, ctypes, json, math, sys
job = json.load(sys.stdin)
params = llama_cpp.llama_model_default_params()
params.vocab_only = True
model = llama_cpp.llama_model_load_from_file(job["vocab"].encode(), params)
vocab = llama_cpp.llama_model_get_vocab(model)

def tokenize(text):
    data = text.encode()
    buf = (llama_cpp.llama_token * (len(data) + 8))()
    n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, len(buf), False, True)
    return list(buf[:n])

patterns = [p.encode() for p in job["patterns"]]
arr = (ctypes.c_char_p * max(1, len(patterns)))(*patterns)
none = (llama_cpp.llama_token * 1)()

def allowed(sampler, token):
    data = (llama_cpp.llama_token_data * 1)()
    data[0].id, data[0].logit, data[0].p = token, 0.0, 0.0
    cur = llama_cpp.llama_token_data_array(data=ctypes.cast(data, ctypes.POINTER(llama_cpp.llama_token_data)), size=1, selected=-1, sorted=False)
    llama_cpp.llama_sampler_apply(sampler, ctypes.byref(cur))
    return not math.isinf(data[0].logit)

for i, stream in enumerate(job["streams"]):
    print(json.dumps({"start": i}), flush=True)
    pieces = [tokenize(p) for p in stream["pieces"]]
    if len(pieces[-1]) != 1:
        print(json.dumps({"stream": i, "forbidden_at": "not one token"}), flush=True)
        continue
    tokens = [t for piece in pieces for t in piece] + tokenize(stream["after"])
    sampler = llama_cpp.llama_sampler_init_grammar_lazy_patterns(vocab, job["grammar"].encode(), b"root", arr, len(patterns), none, 0)
    assert sampler, "llama.cpp refused the grammar or its patterns"
    forbidden = None
    for n, token in enumerate(tokens):
        if not allowed(sampler, token):
            forbidden = n
            break
        llama_cpp.llama_sampler_accept(sampler, token)
    llama_cpp.llama_sampler_free(sampler)
    print(json.dumps({"stream": i, "forbidden_at": forbidden}), flush=True)
"""

WRONG_CALL = '{"name": "get_weather", "arguments": {"days": 3}}'  # city is required

# format, the pieces whose last token completes a head with text the grammar cannot take,
# and a later wrong call that a started grammar must refuse (None: the format's calls are
# the whole reply, so nothing after the start can trigger)
CASES = [
    ("hermes", ["<tool_call>\n", '{"name": "get', "_weather", '"}'], "\n<tool_call>\n" + WRONG_CALL),
    ("hermes_xml", ["<tool_call>\n", "<function=get", "_weather", "><"],
     "\n<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"),
    ("mistral", ["[TOOL_CALLS", "]:"], '[TOOL_CALLS]get_weather[ARGS]{"days": 3}'),
    ("mistral", ["Use [TOOL_CALLS", "]:"], " to call.\n[TOOL_CALLS][" + WRONG_CALL + "]"),
    ("llama3", ["{}"], None),
    ("json", ["[]"], None),
    ("json", ["{}"], None),
]


def feed(vocab_path, spec, streams: list[tuple[list[str], str]]) -> list:
    """Where the grammar first forbade a token in each stream of (pieces, after): None for
    never, "not one token" where the vocabulary splits the last piece. Fails the test if
    llama.cpp aborts, naming the stream."""
    job = {
        "vocab": str(vocab_path), "grammar": spec.grammar, "patterns": spec.trigger_patterns,
        "streams": [{"pieces": pieces, "after": after} for pieces, after in streams],
    }
    env = {**os.environ, "GGML_NO_BACKTRACE": "1"}  # an abort prints no gdb backtrace
    proc = subprocess.run([sys.executable, "-c", FEED], input=json.dumps(job), capture_output=True, text=True, timeout=300, env=env)
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    if proc.returncode != 0:
        started = [line["start"] for line in lines if "start" in line]
        which = streams[started[-1]] if started else None
        pytest.fail(f"llama.cpp aborted (exit {proc.returncode}) on {which!r}:\n{proc.stderr[-2000:]}")
    return [line["forbidden_at"] for line in lines if "stream" in line]


@pytest.mark.parametrize(("fmt", "pieces", "later"), CASES, ids=[f"{c[0]}:{''.join(c[1])!r}" for c in CASES])
def test_a_token_past_a_head_never_reaches_the_grammar_unfiltered(qwen35_vocab, fmt, pieces, later):
    spec = tool_call_grammar(TOOLS, ToolChoice("auto"), fmt)
    assert spec.lazy and spec.trigger_texts == []  # patterns only: a trigger token starts at a bare marker
    streams = [(pieces, "")] + ([(pieces, later)] if later is not None else [])
    results = feed(qwen35_vocab, spec, streams)
    assert results[0] is None  # nothing started: what followed the head stays prose
    if later is not None:  # a later call's head still starts the grammar, which refuses the wrong call
        assert isinstance(results[1], int), results


HEADS = {
    "hermes": ["<tool_call>\n", '{"name": "get_weather'],
    "hermes_xml": ["<tool_call>\n", "<function=get_weather"],
    "llama3": ['{"name": "get_weather'],
    "mistral": ["[TOOL_CALLS]get_weather"],
    "json": ['{"name": "get_weather'],
}
TAILS = ['"}', '",', '"\n', '"},', '"}\n', '":', "><", ">\n\n", ">\n", "[", "[{", '"', ":", "]:", "],", "{}", "[]", "{\n"]


@pytest.mark.parametrize("fmt", list(HEADS))
def test_no_token_after_a_head_aborts(qwen35_vocab, fmt):
    """The head of a call to get_weather, then each of many one-token tails a model may write
    there (those the vocabulary has): none aborts, and a tail the grammar takes starts it."""
    spec = tool_call_grammar(TOOLS, ToolChoice("auto"), fmt)
    results = feed(qwen35_vocab, spec, [([*HEADS[fmt], tail], "") for tail in TAILS])
    assert len(results) == len(TAILS)
    assert sum(r != "not one token" for r in results) >= len(TAILS) // 2  # most tails are one token here
