"""Tool calls agents can trust, through the real server on the default model: a call cut by
max_tokens is never returned (nor streamed closed), a named tool_choice writes one call and
ends, an integer open on one side stays short; and GET /v1/models/default answers."""

import json

import httpx
import pytest

from tests.helpers import warmslot_server

pytestmark = [pytest.mark.model, pytest.mark.server]

FINAL_ANSWER = {"type": "function", "function": {
    "name": "final_answer",
    "description": "Give the final answer",
    "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
}}
PERSON = {"type": "function", "function": {
    "name": "Person",
    "description": "Correctly extracted `Person` with all the required parameters with correct types",
    "parameters": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                   "required": ["name", "age"]},
}}
TERMINAL = {"type": "function", "function": {
    "name": "terminal",
    "description": "Run a shell command",
    "parameters": {"type": "object", "properties": {
        "command": {"type": "string", "maxLength": 40},
        "timeout": {"type": "integer", "minimum": 1},
    }, "required": ["timeout", "command"]},
}}


@pytest.fixture(scope="module")
def url(default_model):
    proc = warmslot_server(default_model, "-np", "1", "-c", "2048", "--temp", "0")
    yield proc.url
    proc.stop()


def chat(url, **body):
    reply = httpx.post(url + "/v1/chat/completions", json={"model": "default", "temperature": 0, **body}, timeout=300)
    assert reply.status_code == 200, reply.text
    return reply.json()


def stream_chat(url, **body):
    chunks = []
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=300,
                      json={"model": "default", "temperature": 0, "stream": True, **body}) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data: "):]))
    return chunks


WEATHER_IN_DETAIL = dict(messages=[{"role": "user", "content": "Describe the weather in Paris in detail."}],
                         tools=[FINAL_ANSWER], tool_choice="required", max_tokens=20)


def test_a_call_cut_by_max_tokens_is_not_returned(url):
    body = chat(url, **WEATHER_IN_DETAIL)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length"
    assert not choice["message"].get("tool_calls"), "a call whose arguments never closed is not a call"
    assert choice["warmslot"] == {"incomplete_tool_call": 0}  # which call was cut


def test_a_streamed_cut_call_is_never_sent(url):
    """The stream sent the cut call's start and then a made-up closing fragment; a client that
    gathers fragments (llama-index) ran it. Only whole calls are sent."""
    arguments, finish, cut = {}, None, None
    for chunk in stream_chat(url, **WEATHER_IN_DETAIL):
        for choice in chunk.get("choices", []):
            finish = choice.get("finish_reason") or finish
            cut = choice.get("warmslot", {}).get("incomplete_tool_call", cut)
            for call in choice["delta"].get("tool_calls") or []:
                arguments[call["index"]] = arguments.get(call["index"], "") + call["function"].get("arguments", "")
    assert finish == "length"
    assert arguments == {}, "no fragment of a call that never closed was sent"
    assert cut == 0, "the finish chunk names the call that was cut"


def test_a_named_tool_choice_writes_one_call_and_ends(url):
    body = chat(url, messages=[{"role": "user", "content": "Extract: Jason is 25 years old."}], tools=[PERSON],
                tool_choice={"type": "function", "function": {"name": "Person"}}, max_tokens=64)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert len(choice["message"]["tool_calls"]) == 1
    assert set(json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"])) == {"name", "age"}


def test_an_integer_with_only_a_minimum_stays_short(url):
    body = chat(url, messages=[{"role": "user", "content": "List the files, waiting as long as it takes."}],
                tools=[TERMINAL], tool_choice={"type": "function", "function": {"name": "terminal"}}, max_tokens=60)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    timeout = json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"])["timeout"]
    assert 1 <= timeout and len(str(timeout)) <= 16


def test_the_default_model_name_is_a_model(url):
    listed = httpx.get(url + "/v1/models").json()["data"][0]
    reply = httpx.get(url + "/v1/models/default")
    assert reply.status_code == 200 and reply.json() == listed
    assert httpx.get(url + "/v1/models/no-such-model").status_code == 404
