"""Agent frameworks against the real server on the default model: litellm (openai/ provider),
langchain-openai (bind_tools and streaming) and the OpenAI Agents SDK (its Chat Completions
model) each run a tool-call loop, and the second turn reuses the first turn's prompt.

Kept short (two model turns each, few tokens): a forced tool call samples through a grammar,
which is slow on a 262K-token vocabulary and two CPU cores."""

import asyncio
import os

import pytest

from tests.helpers import warmslot_server

pytestmark = [pytest.mark.model, pytest.mark.server]

SYSTEM = "You are a weather agent. Call get_weather for any question about the weather, then answer in one line."
QUESTION = "What is the weather in Paris?"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
RESULT = "18 degrees, cloudy"
# litellm would fetch its model price list from the internet at import (three tries, ~8 s)
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@pytest.fixture(scope="module")
def url(default_model):
    proc = warmslot_server(default_model, "-np", "1", "-c", "4096", "--temp", "0")
    yield proc.url
    proc.stop()


def test_litellm_tool_loop_reuses_the_prefix(url):
    import litellm

    kw = dict(model="openai/warmslot", api_base=url + "/v1", api_key="unused", max_tokens=40, temperature=0)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    first = litellm.completion(messages=messages, tools=[WEATHER_TOOL], tool_choice="required", parallel_tool_calls=False, **kw)
    call = first.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and first.choices[0].finish_reason == "tool_calls"
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": RESULT}]
    second = litellm.completion(messages=messages, tools=[WEATHER_TOOL], **dict(kw, max_tokens=8))
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
    with pytest.raises(litellm.ContextWindowExceededError):
        litellm.completion(messages=[{"role": "user", "content": "word " * 5000}], **dict(kw, max_tokens=2))


def test_langchain_streamed_tool_loop_reuses_the_prefix(url):
    from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """Current weather for a city"""
        return RESULT

    llm = ChatOpenAI(base_url=url + "/v1", api_key="unused", model="warmslot", temperature=0, max_tokens=40,
                     stream_usage=True, max_retries=0)
    messages = [SystemMessage(SYSTEM), HumanMessage(QUESTION)]
    first = None
    for chunk in llm.bind_tools([get_weather], tool_choice="required", parallel_tool_calls=False).stream(messages):
        first = chunk if first is None else first + chunk
    assert first.tool_calls and first.tool_calls[0]["name"] == "get_weather"
    call = first.tool_calls[0]
    messages += [first, ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])]
    second = None
    for chunk in llm.bind_tools([get_weather]).stream(messages, max_tokens=8):
        second = chunk if second is None else second + chunk
    cached = second.usage_metadata["input_token_details"]["cache_read"]
    assert cached >= first.usage_metadata["input_tokens"]


def test_openai_agents_sdk_tool_loop_reuses_the_prefix(url):
    from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, RunHooks, Runner, function_tool,
                        set_tracing_disabled)
    from agents.exceptions import MaxTurnsExceeded
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather for a city"""
        calls.append(city)
        return RESULT

    class Usage(RunHooks):
        def __init__(self) -> None:
            self.responses = []

        async def on_llm_end(self, context, agent, response) -> None:
            self.responses.append(response)

    model = OpenAIChatCompletionsModel(model="warmslot", openai_client=AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0))
    agent = Agent(name="weather", instructions=SYSTEM, tools=[get_weather], model=model,
                  model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=40))
    hooks = Usage()
    try:
        asyncio.run(Runner.run(agent, QUESTION, hooks=hooks, max_turns=2))
    except MaxTurnsExceeded:
        pass  # a small model may call the tool again; two turns are what this test needs
    assert calls and len(hooks.responses) == 2
    first, second = (r.usage for r in hooks.responses)
    assert second.input_tokens_details.cached_tokens >= first.input_tokens
