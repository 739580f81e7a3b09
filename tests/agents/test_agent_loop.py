"""Agents through the official OpenAI client on the default model: tool calls (plain and
streamed), structured output, and prefix reuse across a growing tool-using history, and
conversations that alternate on one slot."""

import json

import jsonschema
import openai
import pytest

from tests.helpers import warmslot_server

pytestmark = [pytest.mark.model, pytest.mark.server]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1, "maximum": 10}},
            "required": ["query", "limit"],
        },
    },
}
TOOLS = [WEATHER, SEARCH]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
SYSTEM = {"role": "system", "content": "You are an agent. Use the tools to answer. Be brief."}


@pytest.fixture(scope="module")
def server(default_model):
    proc = warmslot_server(default_model, "-np", "1", "-c", "8192")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def check_call(call):
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, SCHEMAS[call.function.name])
    assert call.id and call.type == "function"
    return args


def test_required_tool_choice_gives_a_valid_call(client):
    messages = [SYSTEM, {"role": "user", "content": "What's the weather in Paris?"}]
    r = client.chat.completions.create(
        model="x", messages=messages, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=128
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls
    for call in choice.message.tool_calls:
        check_call(call)


def test_required_tool_choice_streamed_gives_the_same_call(client):
    messages = [SYSTEM, {"role": "user", "content": "Search for llama.cpp news."}]
    kw = dict(model="x", messages=messages, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=128)
    plain = client.chat.completions.create(**kw).choices[0].message.tool_calls
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(stream=True, **kw):
        delta = chunk.choices[0].delta
        assert not delta.content, "tool-call text never leaks into content"
        for tc in delta.tool_calls or []:
            entry = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
            if tc.id:
                entry["id"] = tc.id
            if tc.function and tc.function.name:
                entry["name"] = tc.function.name
            if tc.function and tc.function.arguments:
                entry["arguments"] += tc.function.arguments
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert [c["name"] for c in calls.values()] == [c.function.name for c in plain]
    assert [json.loads(c["arguments"]) for c in calls.values()] == [json.loads(c.function.arguments) for c in plain]
    for c in calls.values():
        assert c["id"]
        jsonschema.validate(json.loads(c["arguments"]), SCHEMAS[c["name"]])


def test_named_function_is_the_one_called(client):
    messages = [SYSTEM, {"role": "user", "content": "Anything."}]
    r = client.chat.completions.create(
        model="x", messages=messages, tools=TOOLS, temperature=0, max_tokens=128, parallel_tool_calls=False,
        tool_choice={"type": "function", "function": {"name": "search"}},
    )
    calls = r.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["search"]
    check_call(calls[0])


def test_json_schema_response_format_gives_valid_json(client):
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 24},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        },
        "required": ["name", "age", "tags"],
        "additionalProperties": False,
    }
    r = client.chat.completions.create(
        model="x", temperature=0, max_tokens=300,
        messages=[{"role": "user", "content": "Describe a person as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}},
    )
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    r = client.chat.completions.create(
        model="x", temperature=0, max_tokens=100, response_format={"type": "json_object"},
        messages=[{"role": "user", "content": "Give me a JSON object."}],
    )
    content = r.choices[0].message.content
    # any object: a small model may still be inside a string when max_tokens runs out
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content), dict)
    else:
        assert content.lstrip().startswith("{")


def test_bad_tools_get_400_naming_the_field(client):
    bad = dict(WEATHER, function=dict(WEATHER["function"], name="has space"))
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="x", messages=[SYSTEM], tools=[bad])
    assert info.value.body["param"].startswith("tools[0]")
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="x", messages=[SYSTEM], tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})
    assert info.value.body["param"] == "tool_choice"


def test_agent_loop_reuses_the_whole_previous_turn(client):
    """Eight turns of call -> result, echoing back exactly what the server returned. Every
    turn reuses at least the previous prompt, and 99% of the previous prompt plus reply."""
    messages = [SYSTEM, {"role": "user", "content": "Plan a trip: check the weather in three cities and search for hotels."}]
    previous = None
    ratios = []
    for turn in range(8):
        r = client.chat.completions.create(
            model="x", messages=messages, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=96
        )
        assert r.choices[0].finish_reason == "tool_calls"
        msg = r.choices[0].message
        assert msg.tool_calls, f"turn {turn} made no call"
        u = r.usage
        if previous is not None:
            assert u.prompt_tokens_details.cached_tokens >= previous.prompt_tokens
            ratios.append(u.prompt_tokens_details.cached_tokens / (previous.prompt_tokens + previous.completion_tokens))
        previous = u
        messages.append(msg.model_dump(exclude_none=True))
        for call in msg.tool_calls:
            result = {"ok": True, "turn": turn, "name": call.function.name, "result": "sunny, 21 C" if call.function.name == "get_weather" else "3 hotels found"}
            messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
    assert min(ratios) >= 0.99, ratios


def test_alternating_conversations_come_back_warm(client):
    """-np 1: A, B, C share a long system prompt and alternate on the one slot; A's return
    reuses at least 99% of A's previous prompt (llama.cpp's server recomputes A's tail)."""
    shared = {"role": "system", "content": "You are a support agent for a bicycle shop. " * 40}
    def convo(topic):
        return [shared, {"role": "user", "content": f"I have a question about {topic}. " * 12}]

    first = {}
    for name, topic in (("A", "brakes"), ("B", "gears"), ("C", "tires")):
        first[name] = client.chat.completions.create(model="x", messages=convo(topic), max_tokens=8, temperature=0)
    again = client.chat.completions.create(model="x", messages=convo("brakes"), max_tokens=8, temperature=0)
    a_prompt = first["A"].usage.prompt_tokens
    assert again.usage.prompt_tokens == a_prompt
    assert again.usage.prompt_tokens_details.cached_tokens >= 0.99 * a_prompt
    assert again.choices[0].message.content == first["A"].choices[0].message.content
    # and B, now in the cache too, continues warm
    b = convo("gears") + [{"role": "assistant", "content": first["B"].choices[0].message.content}, {"role": "user", "content": "And?"}]
    rb = client.chat.completions.create(model="x", messages=b, max_tokens=8, temperature=0)
    assert rb.usage.prompt_tokens_details.cached_tokens >= first["B"].usage.prompt_tokens
