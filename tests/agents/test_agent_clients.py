"""Agent frameworks against the real server on the default model: litellm (openai/ provider),
langchain-openai (bind_tools and streaming) and the OpenAI Agents SDK (its Chat Completions
model) each run a tool-call loop, and the second turn reuses the first turn's prompt.
instructor (TOOLS mode), smolagents' ToolCallingAgent, llama-index's FunctionAgent and
pydantic-ai each run to completion with a reply that validates, and a call cut by max_tokens
is never run.

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


def test_instructor_extracts_with_a_named_tool_choice(url):
    import instructor
    from openai import OpenAI
    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int

    client = instructor.from_openai(OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0), mode=instructor.Mode.TOOLS)
    person = client.chat.completions.create(
        model="default", response_model=Person, max_retries=0, max_tokens=64, temperature=0,
        messages=[{"role": "user", "content": "Extract: Jason is 25 years old."}],
    )
    assert isinstance(person, Person) and person.name


def test_smolagents_tool_calling_agent_runs_to_an_answer(url):
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    calls: list[str] = []

    @tool
    def get_weather(city: str) -> str:
        """Current weather for a city

        Args:
            city: the city
        """
        calls.append(city)
        return RESULT

    model = OpenAIServerModel(model_id="default", api_base=url + "/v1", api_key="unused", max_tokens=60, temperature=0)
    agent = ToolCallingAgent(tools=[get_weather], model=model, max_steps=2, verbosity_level=0)
    answer = agent.run(QUESTION)
    assert answer is not None and str(answer).strip()
    assert all(isinstance(city, str) and city for city in calls)


def llama_index_agent(url, max_tokens, calls):
    from llama_index.core.agent.workflow import FunctionAgent
    from llama_index.core.tools import FunctionTool
    from llama_index.llms.openai_like import OpenAILike

    def get_weather(city: str) -> str:
        """Current weather for a city"""
        calls.append(city)
        return RESULT

    llm = OpenAILike(model="default", api_base=url + "/v1", api_key="unused", is_chat_model=True,
                     is_function_calling_model=True, context_window=4096, max_tokens=max_tokens, temperature=0,
                     max_retries=0)
    return FunctionAgent(tools=[FunctionTool.from_defaults(get_weather)], llm=llm, system_prompt=SYSTEM)


async def run_llama_index(agent, question, iterations):
    return await agent.run(question, max_iterations=iterations)  # a workflow starts inside a loop


def test_llama_index_function_agent_runs_to_an_answer(url):
    calls: list[str] = []
    result = asyncio.run(run_llama_index(llama_index_agent(url, 60, calls), QUESTION, 3))
    assert str(result).strip()
    assert all(isinstance(city, str) and city for city in calls)


def test_a_call_cut_by_max_tokens_is_never_run(url):
    """llama-index ran get_weather({}) when the server closed a cut call into valid JSON."""
    from llama_index.core.workflow.errors import WorkflowRuntimeError

    calls: list[str] = []
    # 22 tokens end the forced call at `{"city": "Paris` (23 close it): the old server
    # closed that into {"city": "Paris"} and the agent ran the tool
    agent = llama_index_agent(url, 22, calls)
    agent.llm.additional_kwargs = {"tool_choice": "required"}
    try:
        asyncio.run(run_llama_index(agent, "Get the weather in Paris, France, Europe, with its full name spelled out.", 2))
    except WorkflowRuntimeError:
        pass  # the agent may give up after its iterations; the point is the tool
    assert calls == [], "a call whose arguments never closed was run"


def test_pydantic_ai_agent_with_one_tool_returns_valid_output(url):
    from pydantic import BaseModel, Field
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.usage import UsageLimits

    class Weather(BaseModel):  # bounded, so the forced output call closes within max_tokens
        city: str = Field(max_length=20)
        summary: str = Field(max_length=40)

    calls: list[str] = []
    model = OpenAIChatModel("default", provider=OpenAIProvider(base_url=url + "/v1", api_key="unused"))
    agent = Agent(model, output_type=Weather, system_prompt=SYSTEM, retries=0,
                  model_settings={"max_tokens": 60, "temperature": 0, "parallel_tool_calls": False})

    async def once(ctx, tool_def):  # after one call only the output tool is left: two requests
        return None if calls else tool_def

    @agent.tool_plain(prepare=once)
    def get_weather(city: str) -> str:
        """Current weather for a city"""
        calls.append(city)
        return RESULT

    result = agent.run_sync(QUESTION, usage_limits=UsageLimits(request_limit=3))
    assert isinstance(result.output, Weather) and result.output.city
