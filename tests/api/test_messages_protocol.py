"""Anthropic's Messages API over the pipeline, driven by a scripted engine (no model): the
official `anthropic` client reads every error type, a stream that fails mid-way ends with an
`error` event, tool calls stream as `input_json_delta`, the stop sequence is reported, and
the request conversion keeps the prefix stable (Claude Code's billing header dropped,
`cache_control` breakpoints become checkpoint positions), and what current Claude Code sends
is taken: structured output as a grammar, thinking and effort as the template's switch and
the budget, deferred tools shown where a tool result loads them, server tools, betas and
fields it needs nothing of accepted."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest

from tests.fake_engine import FakeEngine, fail, reply
from tests.api.test_pipeline import FakeServer
from warmslot.server.api.messages.convert import parse_request
from warmslot.server.api.messages.errors import error_body, status_of
from warmslot.server.api.messages.options import reasoning
from warmslot.server.errors import Forbidden
from warmslot.slots import ErrorKind, Event, FinishReason, QueueFull, Usage

KEY = "sk-local"
BODY = {"model": "claude-local", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
WEATHER = {"name": "get_weather", "description": "Weather of a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def billing(cch: str, version: str) -> dict:
    return {"type": "text", "text": f"x-anthropic-billing-header: cc_version={version}; cc_entrypoint=cli; cch={cch};"}


@pytest.fixture(scope="module")
def server():
    with FakeServer(FakeEngine(), "--api-key", KEY, "--max-body", "20000B") as s:
        yield s


@pytest.fixture
def client(server):
    server.engine.script = reply("Hello", " world")
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0)


def test_every_error_takes_anthropics_shape_and_type(server, client):
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(**dict(BODY, messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}]))
    assert bad.value.body["type"] == "error" and "messages[0].content[0]" in bad.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        client.post("/v1/messages", cast_to=object, body={k: v for k, v in BODY.items() if k != "max_tokens"})
    with pytest.raises(anthropic.AuthenticationError) as auth:
        anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0).messages.create(**BODY)
    assert auth.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.post("/v1/messages/nowhere", cast_to=object, body={})
    assert missing.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.RequestTooLargeError) as large:
        client.messages.create(**dict(BODY, messages=[{"role": "user", "content": "x" * 30000}]))
    assert large.value.body["error"]["type"] == "request_too_large"
    server.engine.script = fail(after=0, kind=ErrorKind.INTERNAL, message="boom")
    with pytest.raises(anthropic.InternalServerError) as internal:
        client.messages.create(**BODY)
    assert internal.value.status_code == 500 and internal.value.body["error"]["type"] == "api_error"
    assert status_of(Forbidden("admin only")) == 403 and error_body(Forbidden("x"))["error"]["type"] == "permission_error"


def test_a_full_queue_is_overloaded_529_with_retry_after(server, client, monkeypatch):
    def full(req):
        raise QueueFull("4 requests wait")

    monkeypatch.setattr(server.engine, "submit", full)
    with pytest.raises(anthropic.OverloadedError) as busy:
        client.messages.create(**BODY)
    assert busy.value.status_code == 529 and busy.value.response.headers["retry-after"] == "1"
    assert busy.value.body["error"]["type"] == "overloaded_error"


def test_both_key_headers_and_the_version_headers_are_accepted(server, client):
    headers = {"anthropic-version": "2023-06-01", "anthropic-beta": "prompt-caching-2024-07-31"}
    for auth in ({"x-api-key": KEY}, {"authorization": f"Bearer {KEY}"}):
        r = httpx.post(server.url + "/v1/messages?beta=true", json=BODY, headers={**headers, **auth}, timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()["content"] == [{"type": "text", "text": "Hello world"}] and r.json()["model"] == BODY["model"]
    bearer = anthropic.Anthropic(base_url=server.url, auth_token=KEY, max_retries=0)
    assert bearer.messages.create(**BODY).stop_reason == "end_turn"


def test_a_stream_that_fails_mid_way_ends_with_an_error_event(server):
    server.engine.script = fail(after=2)
    events = []
    with httpx.stream("POST", server.url + "/v1/messages", json=dict(BODY, stream=True), headers={"x-api-key": KEY}, timeout=30) as r:
        assert r.status_code == 200
        events = [(None, line[5:].strip()) for line in r.iter_lines() if line.startswith("data:")]
    kinds = [json.loads(data)["type"] for _, data in events]
    assert kinds[:2] == ["message_start", "ping"] and kinds[-1] == "error", kinds
    assert "message_stop" not in kinds
    assert json.loads(events[-1][1])["error"]["type"] == "timeout_error"


def test_a_streamed_tool_call_is_a_tool_use_block_of_json_deltas(server, client):
    server.engine.script = reply('<tool_call>\n{"name": "get_weather", ', '"arguments": {"city": "Paris"}}\n</tool_call>')
    body = dict(BODY, tools=[WEATHER], tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    kinds = []
    with client.messages.stream(**body) as stream:
        for event in stream:
            kinds.append((event.type, getattr(getattr(event, "delta", None), "type", None)))
        final = stream.get_final_message()
    assert ("content_block_delta", "input_json_delta") in kinds
    assert final.stop_reason == "tool_use"
    call = final.content[-1]
    assert call.type == "tool_use" and call.name == "get_weather" and call.input == {"city": "Paris"}
    plain = client.messages.create(**body)
    assert plain.stop_reason == "tool_use" and plain.content[-1].input == {"city": "Paris"}
    # Claude Code's own tools bound strings far past what a grammar can afford
    huge = json.loads(json.dumps(WEATHER))
    huge["input_schema"]["properties"]["city"]["maxLength"] = 524288
    assert client.messages.create(**dict(body, tools=[huge])).stop_reason == "tool_use"
    assert server.engine.submitted[-1].sampling.grammar is not None  # tool_choice reached the pipeline


def test_a_stop_sequence_is_named_in_the_reply(server, client):
    def stopped(req):
        usage = Usage(prompt_tokens=len(req.tokens), cached_tokens=0, completion_tokens=1)
        return [Event(text="Hi", tokens=[72]), Event(finish=FinishReason.STOP, usage=usage, stop_sequence="END")]

    server.engine.script = stopped
    out = client.messages.create(**dict(BODY, stop_sequences=["END"]))
    assert out.stop_reason == "stop_sequence" and out.stop_sequence == "END"
    assert server.engine.submitted[-1].stop == ("END",)


def test_the_billing_header_never_reaches_the_prompt_unless_kept(server, client):
    def tokens(system):
        client.messages.create(**dict(BODY, system=system))
        return server.engine.submitted[-1].tokens

    rest = {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}}
    first = tokens([billing("a5145", "2.1.37.3a2"), rest])
    assert tokens([billing("0c0ff", "2.1.38.9e1"), rest]) == first
    assert tokens([rest]) == first  # a header block added or dropped changes nothing either
    assert tokens("x-anthropic-billing-header: cc_version=2.1.39; cch=1;\nYou are a coding agent.") == first
    with FakeServer(FakeEngine(reply("ok")), "--keep-billing-header") as kept:
        plain = anthropic.Anthropic(base_url=kept.url, api_key="-", max_retries=0)
        plain.messages.create(**dict(BODY, system=[billing("a5145", "2.1.37"), rest]))
        plain.messages.create(**dict(BODY, system=[billing("0c0ff", "2.1.37"), rest]))
        a, b = (r.tokens for r in kept.engine.submitted[-2:])
        assert a != b and kept.engine.vocab.detokenize(a).count("x-anthropic-billing-header") == 1


def test_cache_control_marks_a_checkpoint_at_the_end_of_its_message(server, client):
    history = [{"role": "user", "content": "Read the file."}, {"role": "assistant", "content": "Done."}, {"role": "user", "content": "Next."}]
    client.messages.create(**dict(BODY, messages=history))
    plain = server.engine.submitted[-1]
    marked = json.loads(json.dumps(history))
    marked[0]["content"] = [{"type": "text", "text": "Read the file.", "cache_control": {"type": "ephemeral"}}]
    client.messages.create(**dict(BODY, messages=marked))
    req = server.engine.submitted[-1]
    assert req.tokens == plain.tokens
    added = set(req.boundaries) - set(plain.boundaries)
    assert len(added) == 1
    at = added.pop()
    assert server.engine.vocab.detokenize(req.tokens[:at]).endswith("Read the file.")


def test_count_tokens_counts_the_prompt_a_request_submits(server, client):
    body = dict(BODY, system="Be brief.", tools=[WEATHER],
                messages=[{"role": "user", "content": "Weather?"},
                          {"role": "assistant", "content": [{"type": "thinking", "thinking": "call it", "signature": ""},
                                                            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                          {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18C"}], "is_error": False}]}])
    client.messages.create(**body)
    counted = client.messages.count_tokens(**{k: v for k, v in body.items() if k != "max_tokens"})
    assert counted.input_tokens == len(server.engine.submitted[-1].tokens)
    text = server.engine.vocab.detokenize(server.engine.submitted[-1].tokens)
    assert "18C" in text and '"city": "Paris"' in text


def test_a_users_sessions_share_one_tenant_and_users_do_not(server, client):
    def tenant(user_id):
        client.messages.create(**dict(BODY, metadata={"user_id": user_id}))
        return server.engine.submitted[-1].tenant

    device = '{"device_id":"d1","account_uuid":"","session_id":"%s"}'
    assert tenant(device % "s-1") == tenant(device % "s-2") != tenant(device.replace("d1", "d2") % "s-1")
    assert tenant("user_ab_account_cd_session_0f-1") == tenant("user_ab_account_cd_session_9e-2") != tenant("user_xy")


def test_the_session_in_metadata_user_id_reaches_the_engine(server, client):
    def session(user_id):
        client.messages.create(**dict(BODY, **({"metadata": {"user_id": user_id}} if user_id is not None else {})))
        return server.engine.submitted[-1].session

    assert session('{"device_id":"d1","account_uuid":"","session_id":"5e55-01"}') == "5e55-01"
    assert session("user_ab_account_cd_session_0f-1a") == "0f-1a"
    assert session("user_xy") == session('{"device_id":"d1"}') == session(None) == ""


def test_betas_and_fields_claude_code_sends_that_change_nothing_are_accepted_and_logged(server, client, caplog):
    body = dict(BODY, context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
                thinking={"type": "adaptive", "display": "omitted"}, output_config={"effort": "medium"},
                tools=[WEATHER, {"type": "web_search_20250305", "name": "web_search", "max_uses": 8}],
                service_tier="auto")
    betas = "claude-code-20250219,mid-conversation-system-2026-04-07,no-such-beta-2099-01-01"
    with caplog.at_level("DEBUG", logger="warmslot.server"):
        out = client.post("/v1/messages?beta=true", cast_to=object, body=body, options={"headers": {"anthropic-beta": betas}})
    assert out["type"] == "message"
    logged = " ".join(r.getMessage() for r in caplog.records if "ignored" in r.getMessage())
    for name in ("context_management", "service_tier", "thinking.display", "server tool web_search", "no-such-beta-2099-01-01"):
        assert name in logged, logged
    text = server.engine.vocab.detokenize(server.engine.submitted[-1].tokens)
    assert "get_weather" in text and "web_search" not in text  # a server tool is Anthropic's to run


def test_output_config_format_constrains_the_reply_to_its_schema(server, client):
    schema = {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"], "additionalProperties": False}
    server.engine.script = reply('{"title": "Fix the parser"}')
    for shape in ({"output_config": {"effort": "low", "format": {"type": "json_schema", "schema": schema}}},
                  {"output_format": {"type": "json_schema", "schema": schema}}):
        out = client.post("/v1/messages", cast_to=object, body=dict(BODY, **shape))
        assert json.loads(out["content"][-1]["text"]) == {"title": "Fix the parser"}
        assert server.engine.submitted[-1].sampling.grammar is not None
    with pytest.raises(anthropic.BadRequestError, match="output_config.format.type"):
        client.post("/v1/messages", cast_to=object, body=dict(BODY, output_config={"format": {"type": "xml"}}))
    with pytest.raises(anthropic.BadRequestError, match="output_format.schema"):
        client.post("/v1/messages", cast_to=object, body=dict(BODY, output_format={"type": "json_schema"}))


def test_thinking_and_effort_become_the_template_switch_and_the_budget():
    def parsed(**fields):
        out = parse_request(dict(BODY, **fields), 259, None, default_budget=-1, keep_billing_header=False)
        return out.chat.template_kwargs.get("enable_thinking"), out.budget

    assert parsed() == (False, 0)  # no `thinking`: no extended thinking, as Anthropic's API means it
    assert parsed(thinking={"type": "disabled"}) == (False, 0)
    assert parsed(thinking={"type": "enabled", "budget_tokens": 2048}) == (True, 2048)
    assert parsed(thinking={"type": "adaptive"}, output_config={"effort": "low"}) == (None, 1024)
    assert parsed(thinking={"type": "adaptive"}, output_config={"effort": "medium"}) == (None, 8192)
    assert parsed(thinking={"type": "adaptive"}, output_config={"effort": "high"}) == (None, 32768)
    assert parsed(thinking={"type": "adaptive"}, output_config={"effort": "max"}) == (None, -1)
    assert parsed(thinking={"type": "adaptive"}) == (None, -1)
    # an effort never asks for more than the server's own budget
    assert reasoning({"thinking": {"type": "adaptive"}, "output_config": {"effort": "high"}}, 4096).budget == 4096
    with pytest.raises(Exception, match="budget_tokens"):
        parsed(thinking={"type": "enabled"})


def test_a_deferred_tool_is_shown_where_a_tool_result_loads_it_and_can_be_called(server, client):
    """Claude Code's ToolSearch: the tool list keeps its start while WebFetch and the like are
    loaded; the result's `tool_reference` shows the loaded tool's definition."""
    search = {"name": "ToolSearch", "description": "Loads deferred tools", "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}}}
    deferred = dict(WEATHER, defer_loading=True)
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "ToolSearch", "input": {"query": "select:get_weather"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": [{"type": "tool_reference", "tool_name": "get_weather"}]},
                                     {"type": "text", "text": "Tool loaded."}]},
    ]
    server.engine.script = reply('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    out = client.messages.create(**dict(BODY, tools=[search, deferred], messages=messages))
    text = server.engine.vocab.detokenize(server.engine.submitted[-1].tokens)
    shown = '<functions>\n<function>{"description": "Weather of a city", "name": "get_weather", "parameters"'
    assert shown in text and text.index('"get_weather"') == text.index(shown) + len('<functions>\n<function>{"description": "Weather of a city", "name": ')
    assert out.stop_reason == "tool_use" and out.content[-1].name == "get_weather"
    # the prompt up to the tool result is the one before the tool was loaded
    before = dict(BODY, tools=[search, dict(deferred, name="other_tool")], messages=messages[:2] + [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "nothing"}]}])
    client.messages.create(**before)
    earlier = server.engine.vocab.detokenize(server.engine.submitted[-1].tokens)
    assert text[:text.index("<functions>")] == earlier[:earlier.index("nothing")]
