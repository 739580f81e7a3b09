"""The run command's model: `warmslot` with no -m serves SmolLM2 135M Instruct, which answers
a chat message on topic and makes a forced tool call that validates. The real server, started
exactly as the README's quick start starts it (no model flag)."""

from __future__ import annotations

import json
import re
import sys

import httpx
import jsonschema
import pytest

from scripts.server_process import ServerProcess
from tests.helpers import THREADS

pytestmark = [pytest.mark.model, pytest.mark.server]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture(scope="module")
def server(chat_model):
    cmd = [sys.executable, "-m", "warmslot.server", "-t", str(THREADS), "-np", "1", "-c", "2048"]
    proc = ServerProcess("warmslot", cmd, ready_timeout=180)
    yield proc
    proc.stop()


def chat(server, messages, **extra):
    body = {"model": "default", "messages": messages, "temperature": 0, **extra}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_the_run_command_serves_the_chat_model(server, chat_model):
    props = httpx.get(server.url + "/props").json()
    assert props["model_path"] == str(chat_model)
    assert "using the embedded default model (SmolLM2" in server.output()


def test_a_question_gets_an_answer_on_topic(server):
    reply = chat(server, [{"role": "user", "content": "What color is the sky on a clear day?"}], max_tokens=24)
    text = reply["choices"][0]["message"]["content"]
    assert "blue" in text.lower(), text  # an answer, not a continuation of the question
    # its log line: where the prompt came from, its timings, and how long the prompt took to build
    assert re.search(r"chat: prompt \d+ = \d+ cached \(\w+\) \+ \d+ computed, ttft \d+ ms, .* prompt built in \d+ ms", server.output())


def test_a_required_tool_call_validates(server):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    reply = chat(server, messages, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False, max_tokens=64)
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    call = choice["message"]["tool_calls"][0]["function"]
    assert call["name"] == "get_weather"
    jsonschema.validate(json.loads(call["arguments"]), WEATHER["function"]["parameters"])
