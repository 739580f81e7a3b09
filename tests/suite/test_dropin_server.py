"""The real server as a llama-server user and an agent framework meet it: the probes
(/props, /v1/props, /version, models), the context error, start-up (bind first, one URL line,
the capacity table), flags that change nothing, tool-call and prompt-stability edge cases,
the reasoning budget, and the default context."""

import socket
import subprocess
import time

import httpx
import openai
import pytest

from scripts.server_process import warmslot_command
from tests.helpers import tiny_engine, warmslot_server

pytestmark = [pytest.mark.model, pytest.mark.server]

# the keys of llama-server's GET /props (same llama.cpp commit, CPU build) that clients read
LLAMA_SERVER_PROPS = {
    "default_generation_settings", "total_slots", "model_alias", "model_path", "modalities", "endpoint_slots",
    "endpoint_props", "endpoint_metrics", "chat_template", "chat_template_caps", "bos_token", "eos_token",
    "build_info", "is_sleeping",
}
LLAMA_SERVER_PARAMS = {
    "seed", "temperature", "top_k", "top_p", "min_p", "repeat_last_n", "repeat_penalty", "presence_penalty",
    "frequency_penalty", "max_tokens", "n_predict", "stream", "reasoning_format", "samplers",
}
NO_EFFECT = ("--jinja", "--metrics", "--slots", "-cb")


@pytest.fixture(scope="module")
def server(default_model):
    proc = warmslot_server(default_model, "-np", "2", "-c", "2048", "-a", "gemma-test,other", "--temp", "0.5",
                           "--cache-ram", "64", *NO_EFFECT)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


# -- probes -------------------------------------------------------------------------------


def test_props_has_llama_servers_shape_and_the_slot_context(server):
    props = httpx.get(server.url + "/props").json()
    assert LLAMA_SERVER_PROPS <= set(props)
    settings = props["default_generation_settings"]
    assert settings["n_ctx"] == 1024  # -c 2048 over two slots: what one request may use
    assert LLAMA_SERVER_PARAMS <= set(settings["params"])
    assert settings["params"]["temperature"] == 0.5  # --temp
    assert props["total_slots"] == 2
    assert props["model_alias"] == "gemma-test"
    assert props["model_path"].endswith(".gguf")
    assert "<start_of_turn>" in props["chat_template"]
    assert props["build_info"].startswith("warmslot ") and "llama.cpp" in props["build_info"]
    assert httpx.get(server.url + "/v1/props").json() == props


def test_version(server):
    version = httpx.get(server.url + "/version").json()
    assert version["version"] and version["llama_cpp_python"] == "0.3.36" and version["build_info"]


def test_models_report_the_slot_context(server, client):
    entry = httpx.get(server.url + "/v1/models").json()["data"][0]
    assert entry["context_length"] == entry["max_model_len"] == 1024
    assert entry["meta"]["n_ctx_train"] == 32768
    assert hermes_context_length(entry) == 1024  # not the training context
    assert client.models.retrieve("gemma-test").id == "gemma-test"
    assert client.models.retrieve("other").id == "gemma-test"  # an alias
    assert httpx.get(server.url + "/v1/models/gemma-test").json()["max_model_len"] == 1024
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("no-such-model")
    assert info.value.body["code"] == "model_not_found" and info.value.body["param"] == "model"
    assert httpx.get(server.url + "/api/v1/models").status_code == 404  # LM Studio's; llama-server has none


def hermes_context_length(payload: dict) -> int | None:
    """hermes-agent 0.19.0 (agent/model_metadata.py, _extract_context_length): the first key of
    its list met walking the nested dicts in order, whichever key it is."""
    keys = {"context_length", "context_window", "context_size", "max_context_length", "max_position_embeddings",
            "max_model_len", "max_input_tokens", "max_sequence_length", "max_seq_len", "n_ctx_train", "n_ctx", "ctx_size"}

    def dicts(value):
        if isinstance(value, dict):
            yield value
            for nested in value.values():
                yield from dicts(nested)

    for mapping in dicts(payload):
        for key, value in mapping.items():
            if key in keys and isinstance(value, int) and 1024 <= value:
                return value
    return None


def test_context_overflow_is_recognised(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="x", messages=[{"role": "user", "content": "word " * 1500}], max_tokens=4)
    error = info.value.body
    assert "exceeds the available context size" in error["message"]
    assert error["n_ctx"] == 1024 and error["n_prompt_tokens"] > 1024
    assert error["code"] == "exceed_context_size_error"


# -- start-up --------------------------------------------------------------------------------


def test_start_up_log(server):
    log = server.output()
    listening = [line for line in log.splitlines() if "listening on" in line]
    assert len(listening) == 1 and f"http://127.0.0.1:{server.port}" in listening[0]
    assert log.index("listening on") < log.index("loading ")  # bound before the model loads
    table = log[log.index("capacity:"):]
    for row in ("weights", "KV cache", "checkpoints", "prompt cache (RAM)  64.0 MiB", "pinned host memory"):
        assert row in table, row
    for flag in ("--jinja", "--metrics", "--slots", "--cont-batching"):
        assert f"{flag} has no effect" in log


def test_slots_show_the_capacity(server):
    capacity = httpx.get(server.url + "/engine").json()["capacity"]
    assert capacity["weights_bytes"]["CPU"] > 200 << 20  # the 253 MB model
    assert capacity["kv_bytes_per_token"] > 0 and capacity["kv_bytes"]["CPU"] > 0
    assert capacity["cache_ram_bytes"] == 64 << 20 and capacity["cache_ram"] == "flag"
    assert capacity["n_ctx_slot"] == 1024
    assert httpx.get(server.url + "/props").json()["capacity"] == capacity


def test_a_busy_port_fails_at_once(default_model):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        t0 = time.monotonic()
        done = subprocess.run([*warmslot_command(default_model), "--port", str(port)], capture_output=True,
                              text=True, timeout=60)
        elapsed = time.monotonic() - t0
    assert done.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr and "another server" in done.stderr
    assert "loading" not in done.stderr  # nothing was loaded
    assert elapsed < 5  # about 0.1 s: it binds before importing llama.cpp (generous for a busy machine)


def test_default_context_is_the_training_context_when_it_fits(tiny_models):
    engine = tiny_engine(tiny_models["attention"], n_ctx=0, n_parallel=2)
    try:
        info = engine.info
        assert info.context.source.value == "training" and info.n_ctx == info.n_ctx_train == 4096
        assert info.n_ctx_slot == 2048
        assert info.capacity.weights_bytes and info.capacity.recurrent_bytes_per_slot is None
    finally:
        engine.stop()


def test_capacity_of_a_recurrent_model(tiny_models):
    engine = tiny_engine(tiny_models["recurrent"], n_ctx=1024, n_parallel=2)
    try:
        capacity = engine.info.capacity
        assert capacity.recurrent_bytes_per_slot > 0
        assert "recurrent state" in capacity.table()
    finally:
        engine.stop()


# -- tool calls and prompt stability ---------------------------------------------------------

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
SYSTEM = {"role": "system", "content": "You are a careful agent. Answer questions about the weather with the tools. " * 6}
ASK = {"role": "user", "content": "What is the weather in Paris?"}


@pytest.fixture(scope="module")
def agent_client(default_model):
    proc = warmslot_server(default_model, "-np", "1", "-c", "4096")
    yield openai.OpenAI(base_url=proc.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    proc.stop()


def usage_of(r):
    return r.usage.prompt_tokens, r.usage.prompt_tokens_details.cached_tokens


def test_tool_choice_none_keeps_the_prompt(agent_client):
    kw = dict(model="x", messages=[SYSTEM, ASK], tools=[WEATHER], max_tokens=4, temperature=0)
    first = agent_client.chat.completions.create(**kw)
    none = agent_client.chat.completions.create(**kw, tool_choice="none")
    assert usage_of(none)[0] == usage_of(first)[0]  # the tools are still rendered
    assert usage_of(none)[1] >= usage_of(first)[0] - 1  # so the whole prompt is reused
    assert not none.choices[0].message.tool_calls


def test_a_turn_without_tools_reuses_the_system_prompt(agent_client):
    with_tools = agent_client.chat.completions.create(model="x", messages=[SYSTEM, ASK], tools=[WEATHER], max_tokens=4, temperature=0)
    summary = [SYSTEM, ASK, {"role": "assistant", "content": "It is sunny."},
               {"role": "user", "content": "Summarize the conversation in one line."}]
    without = agent_client.chat.completions.create(model="x", messages=summary, max_tokens=4, temperature=0)
    system_tokens = len(httpx.post(str(agent_client.base_url).replace("/v1/", "/tokenize"),
                                   json={"content": SYSTEM["content"], "add_special": False}).json()["tokens"])
    assert usage_of(with_tools)[0] > usage_of(without)[0] - 20  # the tools were a large part
    assert usage_of(without)[1] >= system_tokens  # the system prompt came from the checkpoint


def test_a_tool_call_cut_by_max_tokens_ends_with_length(agent_client):
    kw = dict(model="x", messages=[SYSTEM, ASK], tools=[WEATHER], tool_choice="required", max_tokens=5, temperature=0)
    plain = agent_client.chat.completions.create(**kw).choices[0]
    assert plain.finish_reason == "length"
    assert not plain.message.tool_calls
    assert "<" not in (plain.message.content or "") and "{" not in (plain.message.content or "")
    content, finish = "", None
    for chunk in agent_client.chat.completions.create(**kw, stream=True):
        if chunk.choices:
            content += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "length"
    assert "<" not in content and "{" not in content


# -- reasoning -------------------------------------------------------------------------------

THINKING_TEMPLATE = """{{- bos_token -}}
{%- for message in messages -%}
{{- '<start_of_turn>' + ('model' if message['role'] == 'assistant' else 'user') + '\\n' + message['content'] + '<end_of_turn>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n<think>\\n' -}}{%- endif -%}"""


def test_reasoning_budget_forces_the_end_of_thinking(default_model, tmp_path):
    template = tmp_path / "thinking.jinja"
    template.write_text(THINKING_TEMPLATE)
    proc = warmslot_server(default_model, "-np", "1", "-c", "2048", "--chat-template-file", str(template),
                           "--reasoning-budget", "3")
    try:
        client = openai.OpenAI(base_url=proc.url + "/v1", api_key="unused", max_retries=0, timeout=300)
        kw = dict(model="x", messages=[{"role": "user", "content": "Tell me about the sea."}], max_tokens=16, temperature=0)
        short = client.chat.completions.create(**kw)
        longer = client.chat.completions.create(**kw, extra_body={"reasoning_budget_tokens": 10})
        bad = httpx.post(proc.url + "/v1/chat/completions", json={**kw, "thinking_budget_tokens": "x"})
    finally:
        proc.stop()
    thought = short.usage.completion_tokens_details.reasoning_tokens
    assert 1 <= thought <= 4  # three tokens, then </think> was forced
    assert short.choices[0].message.reasoning_content  # split off
    assert short.usage.completion_tokens > thought + 2  # and the reply went on after it
    assert thought < longer.usage.completion_tokens_details.reasoning_tokens <= 11
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "thinking_budget_tokens"


def test_model_and_sampling_flags_on_the_server(default_model):
    proc = warmslot_server(default_model, "-np", "1", "-c", "1024", "--no-mmap", "--mlock", "-s", "7", "--temp", "1.0",
                           "-v", "--reasoning-format", "deepseek")
    try:
        locked_kib = int(next(line.split()[1] for line in open(f"/proc/{proc.pid}/status") if line.startswith("VmLck:")))
        props = httpx.get(proc.url + "/props").json()
        ask = {"prompt": "Once upon a time", "max_tokens": 12}  # no seed, no temperature: the flags'
        texts = [httpx.post(proc.url + "/v1/completions", json=ask, timeout=120).json()["choices"][0]["text"] for _ in range(2)]
        log = proc.output()
    finally:
        proc.stop()
    # --mlock: the weights are locked in RAM, or llama.cpp tried and met RLIMIT_MEMLOCK
    assert locked_kib * 1024 > 200 << 20 or "failed to mlock" in log
    assert "CPU model buffer size" in log and "CPU_Mapped" not in log  # --no-mmap: read, not mapped
    assert " DEBUG " in log  # -v
    params = props["default_generation_settings"]["params"]
    assert (params["seed"], params["temperature"], params["reasoning_format"]) == (7, 1.0, "deepseek")
    assert texts[0] == texts[1]  # both sampled at temperature 1 from the server's seed


def test_version_flag():
    done = subprocess.run([*warmslot_command("unused"), "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    assert done.stdout.startswith("warmslot ") and "llama.cpp" in done.stdout and "llama-cpp-python 0.3.36" in done.stdout
