"""The rest of the OpenAI surface through the official client on the default model:
/v1/responses (plain, streamed, tools, json_schema, previous_response_id), logprobs, n > 1,
echo and prompt batches, allowed_tools, /v1/embeddings, and the Agents SDK's default model."""

import asyncio
import json
import re

import httpx
import jsonschema
import numpy as np
import openai
import pytest

from tests.helpers import warmslot_server

pytestmark = [pytest.mark.model, pytest.mark.server]

WEATHER = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
SEARCH = {
    "name": "search",
    "description": "Search the web",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
}
CHAT_TOOLS = [{"type": "function", "function": t} for t in (WEATHER, SEARCH)]
RESPONSE_TOOLS = [{"type": "function", **t} for t in (WEATHER, SEARCH)]
AGENT = "You are an agent. Use the tools to answer. Be brief."


@pytest.fixture(scope="module")
def server(default_model):
    proc = warmslot_server(default_model, "-np", "4", "-c", "8192", "--embeddings", "--responses-store", "2")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def prefill_tokens(server) -> float:
    text = httpx.get(server.url + "/metrics").text
    return float(re.search(r"^warmslot_prefill_tokens_total (\S+)$", text, re.M).group(1))


# -- /v1/responses ----------------------------------------------------------------------------


def test_responses_tool_call_plain_and_streamed(client):
    kw = dict(
        model="x", instructions=AGENT, input="What is the weather in Paris?", tools=RESPONSE_TOOLS,
        tool_choice="required", parallel_tool_calls=False, temperature=0, max_output_tokens=64,
    )
    plain = client.responses.create(**kw)
    assert plain.status == "completed" and plain.object == "response"
    (call,) = plain.output
    assert call.type == "function_call" and call.call_id and call.id.startswith("fc_")
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"] if call.name == "get_weather" else SEARCH["parameters"])
    assert plain.usage.input_tokens > 0 and plain.usage.output_tokens > 0
    events = list(client.responses.create(**kw, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    types = [e.type for e in events]
    assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert types[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    final = events[-1].response.output[0]
    assert deltas == final.arguments == call.arguments and final.name == call.name
    # the repeat evaluated nothing: the same prompt, served whole from the cache
    assert events[-1].response.usage.input_tokens_details.cached_tokens == plain.usage.input_tokens


def test_responses_streamed_text_matches_the_final_response(client):
    events = list(client.responses.create(model="x", input="Write one short sentence about the sea.", temperature=0, max_output_tokens=24, stream=True))
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
    assert types[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert types[-1] == "response.completed"  # also when the token limit cut it (its status says so)
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text and text == events[-1].response.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_responses_json_schema_format(client):
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "sunny": {"type": "boolean"}}, "required": ["city", "sunny"]}
    r = client.responses.create(
        model="x", input="Is it sunny in Rome? Answer as JSON.", temperature=0, max_output_tokens=64,
        text={"format": {"type": "json_schema", "name": "weather", "schema": schema, "strict": True}},
    )
    jsonschema.validate(json.loads(r.output_text), schema)


def test_previous_response_id_continues_from_the_cache_and_eviction_is_explained(client):
    user = {"user": "follow-ups"}  # a tenant of its own: the store keeps 2 responses per tenant
    first = client.responses.create(model="x", instructions=AGENT, input="Name a color.", temperature=0, max_output_tokens=8, **user)
    second = client.responses.create(
        model="x", instructions=AGENT, previous_response_id=first.id, input="And another one?", temperature=0, max_output_tokens=8, **user
    )
    assert second.previous_response_id == first.id
    # the previous prompt and its answer are the new prompt's prefix, served from the cache
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
    assert client.responses.retrieve(second.id, extra_query=user).output_text == second.output_text
    for _ in range(2):
        client.responses.create(model="x", input="Name a fruit.", temperature=0, max_output_tokens=4, **user)
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="x", previous_response_id=first.id, input="More?", max_output_tokens=4, **user)
    assert info.value.body["code"] == "previous_response_not_found" and "evicted" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError):  # another tenant never sees it
        client.responses.create(model="x", previous_response_id=second.id, input="More?", max_output_tokens=4)


def test_chat_and_responses_render_a_tool_conversation_to_the_same_tokens(client):
    history = [
        {"role": "user", "content": "What is the weather in Oslo? (render check)"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_oslo", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
        ]},
        {"role": "tool", "tool_call_id": "call_oslo", "content": "-3 C, snow"},
    ]
    chat = client.chat.completions.create(
        model="x", messages=[{"role": "system", "content": AGENT}, *history], tools=CHAT_TOOLS, temperature=0, max_tokens=2
    )
    items = [
        {"role": "user", "content": history[0]["content"]},
        {"type": "function_call", "call_id": "call_oslo", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
        {"type": "function_call_output", "call_id": "call_oslo", "output": "-3 C, snow"},
    ]
    r = client.responses.create(model="x", instructions=AGENT, input=items, tools=RESPONSE_TOOLS, temperature=0, max_output_tokens=2)
    # same token count, and the whole prompt reused: only identical tokens can be
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.input_tokens_details.cached_tokens == r.usage.input_tokens


def test_responses_errors_are_openai_shaped(server, client):
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="x", input=[{"type": "web_search_call"}])
    assert info.value.body["param"] == "input[0].type"
    r = httpx.post(server.url + "/v1/responses", json={"input": "hi", "tools": [{"name": "no type"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools[0]"


def test_agents_sdk_default_model_runs_a_two_turn_tool_loop(server):
    """The Agents SDK's default (Responses) model: the agent calls the tool, gets its result
    and answers; the second model call reuses the first call's prompt and reply."""
    from agents import Agent, ModelSettings, RunConfig, RunHooks, Runner, function_tool, set_tracing_disabled
    from agents.models.openai_responses import OpenAIResponsesModel
    from agents.run import CallModelData, ModelInputData

    set_tracing_disabled(True)
    cities: list[str] = []
    usages = []

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        cities.append(city)
        return f"It is 18 C and cloudy in {city}."

    class Usage(RunHooks):
        async def on_llm_end(self, context, agent, response):
            usages.append(response.usage)

    def nudge(data: CallModelData) -> ModelInputData:
        """After the tool result, ask about it: with the tool still offered, the 270M model
        would otherwise call it again."""
        items = list(data.model_data.input)
        if items and items[-1].get("type") == "function_call_output":
            items.append({"role": "user", "content": "What did the tool say?"})
        return ModelInputData(input=items, instructions=data.model_data.instructions)

    async def run():
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
        agent = Agent(
            name="weather", instructions=AGENT, tools=[get_weather],
            model=OpenAIResponsesModel("warmslot", client),
            # the 270M model quotes the tool's answer and would go on: a stop string ends it
            model_settings=ModelSettings(
                tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=64,
                extra_body={"stop": ["</tool_response>"]},
            ),
        )
        try:
            return await Runner.run(agent, "What is the weather in Paris?", max_turns=2, hooks=Usage(),
                                    run_config=RunConfig(call_model_input_filter=nudge))
        finally:
            await client.close()

    result = asyncio.run(run())
    assert cities == ["Paris"]
    assert "18 C" in result.final_output
    assert len(usages) == 2
    assert usages[1].input_tokens_details.cached_tokens > usages[0].input_tokens / 2


# -- logprobs, n, echo, batches ------------------------------------------------------------


def test_chat_logprobs_plain_and_streamed(client):
    kw = dict(model="x", messages=[{"role": "user", "content": "Count from one to five."}], temperature=0, max_tokens=8,
              logprobs=True, top_logprobs=3)
    plain = client.chat.completions.create(**kw)
    content = plain.choices[0].logprobs.content
    assert len(content) == plain.usage.completion_tokens
    for entry in content:
        assert len(entry.top_logprobs) == 3 and entry.logprob <= 0
        assert entry.top_logprobs[0].token == entry.token and entry.top_logprobs[0].logprob == entry.logprob  # greedy
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token
    streamed = [e for chunk in client.chat.completions.create(**kw, stream=True) if chunk.choices and chunk.choices[0].logprobs
                for e in chunk.choices[0].logprobs.content]
    assert [(e.token, round(e.logprob, 6)) for e in streamed] == [(e.token, round(e.logprob, 6)) for e in content]


def test_completion_logprobs_echo_and_a_batch_of_prompts(client):
    r = client.completions.create(model="x", prompt="The capital of France is", temperature=0, max_tokens=4, logprobs=2)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset[0] == 0 and all(len(t) == 2 for t in lp.top_logprobs)
    assert all(max(top.values()) == value for top, value in zip(lp.top_logprobs, lp.token_logprobs))  # greedy
    batch = client.completions.create(model="x", prompt=["Once upon a", "The sky is"], temperature=0, max_tokens=3, echo=True, n=2)
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert batch.choices[0].text.startswith("Once upon a") and batch.choices[2].text.startswith("The sky is")
    assert batch.choices[0].text == batch.choices[1].text  # greedy samples of one prompt agree
    streamed = list(client.completions.create(model="x", prompt=["Once upon a", "The sky is"], temperature=0, max_tokens=3, stream=True))
    texts = {0: "", 1: ""}
    for chunk in streamed:
        for c in chunk.choices:
            texts[c.index] += c.text
    assert texts[0] == batch.choices[0].text.removeprefix("Once upon a")
    assert texts[1] == batch.choices[2].text.removeprefix("The sky is")


def test_n_choices_evaluate_the_prompt_once(server, client):
    messages = [{"role": "user", "content": "Invent a name for a new planet. (n test, evaluated once)"}]
    before = prefill_tokens(server)
    r = client.chat.completions.create(model="x", messages=messages, n=4, temperature=1.0, seed=11, max_tokens=8)
    computed = r.usage.prompt_tokens - r.usage.prompt_tokens_details.cached_tokens
    assert prefill_tokens(server) - before == computed  # forks of one prefill, not four
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert len({c.message.content for c in r.choices}) > 1  # seed + i: different samples
    assert 4 <= r.usage.completion_tokens <= 4 * 8  # summed over the choices
    chunks = list(client.chat.completions.create(model="x", messages=messages, n=3, temperature=1.0, seed=11, max_tokens=6,
                                                 stream=True, stream_options={"include_usage": True}))
    finished = {c.index for chunk in chunks for c in chunk.choices if c.finish_reason}
    assert finished == {0, 1, 2}
    assert chunks[-1].usage.prompt_tokens == r.usage.prompt_tokens  # the prompt counted once
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="x", messages=messages, n=9, max_tokens=1)


def _bounded(tool: dict, longest: int) -> dict:
    """`tool` with each string argument at most `longest` characters: the grammar then ends the
    call within a known number of tokens, whatever the model's rounding makes it say."""
    properties = {k: dict(v, maxLength=longest) for k, v in tool["parameters"]["properties"].items()}
    return {"type": "function", "function": dict(tool, parameters=dict(tool["parameters"], properties=properties))}


def test_allowed_tools_narrow_the_grammar_not_the_prompt(client):
    messages = [{"role": "system", "content": AGENT}, {"role": "user", "content": "What is the weather in Lima?"}]
    # room for the whole call: a call max_tokens cuts is dropped, never passed off as whole. A
    # string of at most 24 characters is at most 24 tokens, and the call's JSON a few dozen more
    tools = [_bounded(t, 24) for t in (WEATHER, SEARCH)]
    kw = dict(model="x", messages=messages, tools=tools, parallel_tool_calls=False, temperature=0, max_tokens=160)
    every = client.chat.completions.create(**kw, tool_choice="required")
    narrowed = client.chat.completions.create(**kw, tool_choice={
        "type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [{"type": "function", "function": {"name": "search"}}]},
    })
    assert [c.function.name for c in narrowed.choices[0].message.tool_calls] == ["search"]
    # the same rendered prompt: served whole from the first request's cache
    assert narrowed.usage.prompt_tokens == every.usage.prompt_tokens == narrowed.usage.prompt_tokens_details.cached_tokens


# -- embeddings ------------------------------------------------------------------------------


def test_embeddings_float_base64_and_batches(client):
    texts = ["The cat sat on the mat.", "Stock markets fell today.", "A kitten rested on the rug."]
    batch = client.embeddings.create(model="x", input=texts, encoding_format="float")
    vectors = [np.array(d.embedding) for d in batch.data]
    assert [d.index for d in batch.data] == [0, 1, 2]
    assert all(abs(np.linalg.norm(v) - 1) < 1e-5 for v in vectors)
    assert batch.usage.prompt_tokens == sum(client.embeddings.create(model="x", input=t).usage.prompt_tokens for t in texts)
    one = client.embeddings.create(model="x", input=texts[1])  # the client asks for base64 by default
    # alone or sharing a decode with others: the same vector but for llama.cpp's rounding
    assert float(np.array(one.data[0].embedding) @ vectors[1]) > 0.999
    assert float(vectors[0] @ vectors[2]) > float(vectors[0] @ vectors[1])  # cat/kitten closer than markets


def test_embeddings_of_token_ids_and_usage(server):
    tokens = httpx.post(server.url + "/tokenize", json={"content": "hello world", "add_special": True}).json()["tokens"]
    by_ids = httpx.post(server.url + "/v1/embeddings", json={"input": tokens}).json()
    by_text = httpx.post(server.url + "/v1/embeddings", json={"input": "hello world"}).json()
    assert by_ids["data"][0]["embedding"] == by_text["data"][0]["embedding"]
    assert by_ids["usage"]["prompt_tokens"] == len(tokens)
    bad = httpx.post(server.url + "/v1/embeddings", json={"input": ["ok", ""]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input[1]"


# -- one pipeline under every API ----------------------------------------------------------------


def test_one_conversation_gives_the_same_tokens_through_chat_completions_and_responses(server, client):
    """Every API is an adapter over one pipeline: the same conversation renders to the same
    prompt and, greedy, the same reply; the second and third API reuse the first's prompt."""
    messages = [{"role": "system", "content": "You answer in one short sentence."},
                {"role": "user", "content": "Name a river in Europe and its country."}]
    user = {"cache_salt": "one-pipeline"}
    chat = client.chat.completions.create(model="x", messages=messages, temperature=0, max_tokens=12, extra_body=user)
    tokens = httpx.post(server.url + "/tokenize", json={"messages": messages}, timeout=60).json()["tokens"]
    text = httpx.post(server.url + "/v1/completions", timeout=300, json={
        "prompt": tokens, "temperature": 0, "max_tokens": 12, **user,
    }).json()
    responses = client.responses.create(model="x", input=messages, temperature=0, max_output_tokens=12, extra_body=user)
    assert chat.choices[0].message.content.strip() == text["choices"][0]["text"].strip() == responses.output_text.strip()
    assert chat.usage.completion_tokens == text["usage"]["completion_tokens"] == responses.usage.output_tokens
    assert chat.usage.prompt_tokens == len(tokens) == text["usage"]["prompt_tokens"] == responses.usage.input_tokens
    assert text["usage"]["prompt_tokens_details"]["cached_tokens"] >= len(tokens) - 1  # at most one evaluated
    assert responses.usage.input_tokens_details.cached_tokens >= len(tokens) - 1


# -- llama-server's chat extensions --------------------------------------------------------------


def _chat(server, **body):
    return httpx.post(server.url + "/v1/chat/completions", json={"max_tokens": 6, "temperature": 0, **body}, timeout=120)


def test_a_final_assistant_message_is_continued(server):
    head = [{"role": "user", "content": "Name a fruit."}]
    prefill = [*head, {"role": "assistant", "content": "The fruit is"}]
    r = _chat(server, messages=prefill, verbose=True)
    assert r.status_code == 200, r.text
    prompt = r.json()["__verbose"]["prompt"]
    open_turn = _chat(server, messages=head, verbose=True).json()["__verbose"]["prompt"]
    assert prompt == open_turn + "The fruit is"  # the generation prompt, then the prefill, left open
    explicit = _chat(server, messages=prefill, verbose=True, add_generation_prompt=False, continue_final_message=True)
    assert explicit.json()["__verbose"]["prompt"] == prompt
    closed = _chat(server, messages=prefill, verbose=True, add_generation_prompt=False).json()["__verbose"]["prompt"]
    assert closed.startswith(open_turn + "The fruit is") and len(closed) > len(prompt)  # the turn is closed: no prefill
    both = _chat(server, messages=prefill, add_generation_prompt=True, continue_final_message=True)
    two = _chat(server, messages=[*prefill, {"role": "assistant", "content": "x"}])
    nothing = _chat(server, messages=head, continue_final_message=True)
    assert [(x.status_code, x.json()["error"]["param"]) for x in (both, two, nothing)] == [
        (400, "continue_final_message"), (400, "messages"), (400, "continue_final_message")]


def test_top_level_grammar_and_json_schema_constrain_the_reply(server):
    messages = [{"role": "user", "content": "Say anything."}]
    r = _chat(server, messages=messages, grammar='root ::= "a"{5,5}')
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "aaaaa", r.text
    r = _chat(server, messages=messages, json_schema={"const": "42"})
    assert r.status_code == 200 and json.loads(r.json()["choices"][0]["message"]["content"]) == "42", r.text
    bad = _chat(server, messages=messages, grammar="root ::= this is (not valid GBNF")
    both = _chat(server, messages=messages, grammar='root ::= "a"', json_schema={"const": 1})
    assert (bad.status_code, bad.json()["error"]["param"]) == (400, "grammar")
    assert (both.status_code, both.json()["error"]["param"]) == (400, "grammar")


def test_input_tokens_counts_what_the_chat_request_takes(server):
    body = {"messages": [{"role": "system", "content": AGENT}, {"role": "user", "content": "Weather in Oslo?"}], "tools": CHAT_TOOLS}
    r = httpx.post(server.url + "/chat/completions/input_tokens", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["input_tokens"] == _chat(server, **body, max_tokens=1).json()["usage"]["prompt_tokens"]


def test_embedding_inputs_as_text_parts_and_repeated_inputs(server):
    url = server.url + "/v1/embeddings"
    r = httpx.post(url, json={"input": ["hello world", {"content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]},
                                        "hello world", "goodbye"]}, timeout=60)
    assert r.status_code == 200, r.text
    vectors = [d["embedding"] for d in r.json()["data"]]
    assert vectors[0] == vectors[1] == vectors[2] != vectors[3]  # identical inputs: decoded once, the same vector
    assert r.json()["usage"]["prompt_tokens"] == 3 * len(httpx.post(server.url + "/tokenize", json={"content": "hello world", "add_special": True}).json()["tokens"]) + len(
        httpx.post(server.url + "/tokenize", json={"content": "goodbye", "add_special": True}).json()["tokens"])
    for bad in ({"content": "string"}, {"content": [{"type": "image_url"}]}):
        r = httpx.post(url, json={"input": [bad]})
        assert r.status_code == 400 and r.json()["error"]["param"].startswith("input[0].content"), r.text
