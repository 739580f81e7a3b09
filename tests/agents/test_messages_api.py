"""Anthropic's Messages API against the real server on the default model, through the
official `anthropic` client and the Claude Code CLI (the version tests/install_deps.sh
pins): plain and streamed replies, a tool loop, count_tokens, the prompt reused on the next
turn (`cache_read_input_tokens`), Claude Code's billing header, which changes on every
request, never costing the prefix, and its session-title request answered with JSON of its
schema (structured output).

Kept short (few tokens, one server): a forced tool call samples through a grammar, which is
slow on a 262K-token vocabulary and two CPU cores."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess

import anthropic
import httpx
import jsonschema
import pytest

from tests.helpers import warmslot_server

pytestmark = [pytest.mark.model, pytest.mark.server]

MODEL = "claude-local"  # any name: the loaded model answers
SYSTEM = "You are a weather agent. Call get_weather for any question about the weather, then answer in one line."
WEATHER = {"name": "get_weather", "description": "Current weather for a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
ROOT = pathlib.Path(__file__).resolve().parents[2]
PINNED = re.search(r"^CLAUDE_CODE_VERSION=(\S+)", (ROOT / "tests" / "install_deps.sh").read_text(), re.M).group(1)
NOT_INSTALLED = (f"Claude Code {PINNED} is not installed: tests/install_deps.sh installs it "
                 f"(npm install -g @anthropic-ai/claude-code@{PINNED})")
LOG_LINE = re.compile(r"messages: prompt (\d+) = (\d+) cached")
TITLE_FIXTURE = next((ROOT / "tests" / "data" / "claude_code").glob("*-title.json"))


@pytest.fixture(scope="module")
def server(default_model):
    proc = warmslot_server(default_model, "-np", "1", "-c", "4096", "--temp", "0")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


def prompt_tokens(usage) -> int:
    return usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens


def test_create_plain_then_streamed_reuses_the_first_turn(client):
    messages = [{"role": "user", "content": "Name a color."}]
    first = client.messages.create(model=MODEL, max_tokens=6, system="Be brief.", messages=messages)
    assert first.type == "message" and first.role == "assistant" and first.model == MODEL
    assert first.content[0].type == "text" and first.stop_reason in ("end_turn", "max_tokens")
    assert first.usage.output_tokens >= 1 and first.usage.cache_creation_input_tokens == 0
    messages += [{"role": "assistant", "content": first.content[0].text}, {"role": "user", "content": "Another."}]
    kinds = []
    with client.messages.stream(model=MODEL, max_tokens=6, system="Be brief.", messages=messages) as stream:
        for event in stream:
            kinds.append(event.type)
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert {"content_block_start", "content_block_delta", "content_block_stop", "message_delta"} <= set(kinds)
    assert final.content[0].text and final.stop_reason in ("end_turn", "max_tokens")
    # the second turn reads the whole first prompt from the cache
    assert final.usage.cache_read_input_tokens >= prompt_tokens(first.usage)


def test_tool_loop_then_count_tokens(client):
    kw = dict(model=MODEL, system=SYSTEM, tools=[WEATHER])
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    with client.messages.stream(max_tokens=40, messages=messages, tool_choice={"type": "tool", "name": "get_weather"}, **kw) as stream:
        called = stream.get_final_message()
    assert called.stop_reason == "tool_use"
    call = next(b for b in called.content if b.type == "tool_use")
    assert call.name == "get_weather" and isinstance(call.input.get("city"), str)
    messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in called.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "18 degrees, cloudy"}]}]
    answer = client.messages.create(max_tokens=8, messages=messages, **kw)
    assert answer.stop_reason in ("end_turn", "max_tokens") and answer.content[0].type == "text"
    assert answer.usage.cache_read_input_tokens >= prompt_tokens(called.usage)
    counted = client.messages.count_tokens(messages=messages, **kw)
    assert counted.input_tokens == prompt_tokens(answer.usage)


def test_a_changing_billing_header_reuses_the_whole_prompt(client):
    def ask(cch: str, version: str):
        header = {"type": "text", "text": f"x-anthropic-billing-header: cc_version={version}; cc_entrypoint=cli; cch={cch};"}
        system = [header, {"type": "text", "text": SYSTEM * 4, "cache_control": {"type": "ephemeral"}}]
        return client.messages.create(model=MODEL, max_tokens=2, system=system, messages=[{"role": "user", "content": "Weather in Oslo?"}])

    ask("a5145", "2.1.37.3a2")
    second = ask("0c0ff", "2.1.38.9e1").usage
    assert second.cache_read_input_tokens >= 0.95 * prompt_tokens(second)


def test_the_session_title_request_is_answered_with_json_of_its_schema(server):
    """Claude Code's own title request (`output_config.format`: a json_schema with
    additionalProperties false), as captured from the pinned CLI: the reply is one JSON value
    of the schema."""
    captured = json.loads(TITLE_FIXTURE.read_text(encoding="utf-8"))
    body = dict(captured["body"], max_tokens=40, stream=False)
    reply = httpx.post(server.url + "/v1/messages", json=body, headers=captured["headers"], timeout=300)
    assert reply.status_code == 200, reply.text
    answer = reply.json()
    assert answer["stop_reason"] == "end_turn", answer
    title = json.loads("".join(b["text"] for b in answer["content"] if b["type"] == "text"))
    jsonschema.validate(title, body["output_config"]["format"]["schema"])


def claude_binary() -> str:
    """The pinned CLI (a missing or other version skips, or fails under CI)."""
    path = shutil.which("claude")
    found = subprocess.run([path, "--version"], capture_output=True, text=True).stdout if path else ""
    if not found.startswith(PINNED + " "):
        reason = NOT_INSTALLED + (f" (found {found.strip()})" if found else "")
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return path


def test_claude_code_runs_headless_and_its_next_request_reuses_the_prompt(server, tmp_path):
    """`claude -p` against the server (offline: no telemetry, no updates, no other traffic).
    `--bare` keeps its prompt to about 1K tokens (its full one is about 20K, a minute of
    prefill per session on two CPU cores). A reply cut at CLAUDE_CODE_MAX_OUTPUT_TOKENS makes
    Claude Code send the conversation again with a request to go on: its next request, which
    must reuse the first one's prompt."""
    claude = claude_binary()
    (tmp_path / "home").mkdir()
    env = {
        **os.environ, "HOME": str(tmp_path / "home"), "ANTHROPIC_BASE_URL": server.url, "ANTHROPIC_API_KEY": "unused",
        "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "2",
    }
    before = len(LOG_LINE.findall(server.output()))
    run = subprocess.run([claude, "-p", "Say hi.", "--bare", "--output-format", "json"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    result = json.loads(run.stdout)
    # it ends through its own path: a result, no HTTP error from the server (the 270M model's
    # reply hits the 2-token cap, which Claude Code reports as its own `max_output_tokens`)
    assert result["type"] == "result", run.stdout + run.stderr
    assert result["terminal_reason"] == "completed" or result.get("api_error") == "max_output_tokens", result
    assert result["api_error_status"] is None, result
    requests = [(int(p), int(c)) for p, c in LOG_LINE.findall(server.output())[before:]]
    assert len(requests) >= 2, requests
    (first, _), (_, reused) = requests[0], requests[1]
    assert first > 500 and reused >= 0.95 * first, requests
