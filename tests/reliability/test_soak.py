"""No model output ends the process: a soak of random requests on random-weight models.

One server per chat template and tool-call format (Hermes JSON and XML, Llama 3, Mistral,
the generic JSON fallback), each on a tiny random-weight model of another memory kind, and
two whose logits cannot be sampled (all NaN: the Qwen3.5 shape the abort was first seen on;
+inf and -inf in every row). Each gets a few hundred requests, drawn with a fixed seed:
temperatures 0, 0.7, 1 and 2; top_k, top_p, min_p, typical_p, penalties and logit_bias (one
that removes every token among them); tools auto, required and named, json_object and
json_schema; streamed or not; through /v1/chat/completions, /v1/messages and /v1/responses.

Every request gets an answer in its API's shape: a reply, or an error (a stream ends with its
API's terminal event); random models never answer 5xx, the NaN and inf ones always do, with
code `invalid_logits`. No server aborts, each answers /health 200 at the end, and none wrote
a crash report. The whole module stays within about two minutes on 2 cores.
"""

from __future__ import annotations

import concurrent.futures
import json
import random
import time

import httpx
import pytest

from scripts.server_process import ServerProcess, start_together, warmslot_command
from tests.tiny_models import N_VOCAB, write_tiny_model

pytestmark = [pytest.mark.model, pytest.mark.server]

# name: (model kind, poison, chat template, tool-call format)
SERVERS = {
    "hermes": ("attention", None, "chatml", "hermes"),
    "hermes_xml": ("swa", None, "chatml", "hermes_xml"),
    "llama3": ("attention", None, "llama3", "llama3"),
    "mistral": ("recurrent", None, "mistral", "mistral"),
    "json": ("hybrid", None, "gemma", "json"),
    "nan": ("hybrid", "nan", "chatml", "hermes"),
    "inf": ("attention", "inf", "chatml", "hermes"),
}
REQUESTS = {"nan": 60, "inf": 60}  # each of the others: N_REQUESTS
N_REQUESTS = 240
CONCURRENCY = 4  # requests in flight at once, over all servers (the servers have 2 slots each)

WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}
LOOKUP = {"name": "lookup", "description": "Look a word up", "parameters": {"type": "object", "properties": {"word": {"type": "string"}}}}
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}, "n": {"type": "integer"}}, "required": ["answer"]}
PROMPTS = ["Hi.", "What is the weather in Paris?", "Write a list of three words.", "Answer in JSON.", "Tell me about the sea"]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    folder = tmp_path_factory.mktemp("soak")
    procs = {}
    for name, (kind, poison, template, fmt) in SERVERS.items():
        model = write_tiny_model(kind, folder / f"{name}.gguf", poison=poison)
        args = ["-t", "1", "-np", "2", "-c", "2048", "--chat-template", template, "--tool-format", fmt, "--request-timeout", "60"]
        procs[name] = ServerProcess(name, warmslot_command(model, args), env={"GGML_NO_BACKTRACE": "1"}, ready_timeout=180, start=False)
    start_together(list(procs.values()))
    yield procs
    for proc in procs.values():
        proc.stop()


# -- drawing requests ------------------------------------------------------------------------------


def sampling(rng: random.Random) -> dict:
    """Chat-shaped sampling fields (Responses takes the same ones)."""
    out: dict = {"temperature": rng.choice([0, 0.7, 1, 2])}
    for name, values in (
        ("top_k", [0, 1, 5, 40, 300]), ("top_p", [0.0, 0.1, 0.5, 0.95, 1.0]), ("min_p", [0.0, 0.05, 0.5, 1.0]),
        ("typical_p", [0.2, 1.0]), ("repeat_penalty", [0.5, 1.0, 1.3]), ("frequency_penalty", [-2.0, 0.0, 1.5]),
        ("presence_penalty", [-1.0, 0.0, 2.0]), ("seed", [1, 42]),
    ):
        if rng.random() < 0.4:
            out[name] = rng.choice(values)
    bias = rng.random()
    if bias < 0.1:  # every token removed: nothing can be sampled
        out["logit_bias"] = {str(t): -100 for t in range(N_VOCAB)}
    elif bias < 0.25:  # the tokens a call or a JSON value starts with
        out["logit_bias"] = {str(ord(c)): -100 for c in '{<["'}
    elif bias < 0.4:
        out["logit_bias"] = {str(rng.randrange(N_VOCAB)): rng.choice([-100, -5, 5, 100]) for _ in range(rng.randint(1, 8))}
    return out


def constraint(rng: random.Random) -> str:
    return rng.choice(["none", "none", "auto", "required", "named", "json_object", "json_schema"])


def chat_request(rng: random.Random, stream: bool) -> tuple[str, dict]:
    body = {"messages": [{"role": "user", "content": rng.choice(PROMPTS)}], "max_tokens": rng.randint(4, 24), "stream": stream}
    body.update(sampling(rng))
    kind = constraint(rng)
    if kind in ("auto", "required", "named"):
        body["tools"] = [{"type": "function", "function": WEATHER}, {"type": "function", "function": LOOKUP}]
        body["tool_choice"] = {"type": "function", "function": {"name": "get_weather"}} if kind == "named" else kind
        body["parallel_tool_calls"] = rng.random() < 0.5
    elif kind == "json_object":
        body["response_format"] = {"type": "json_object"}
    elif kind == "json_schema":
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "reply", "schema": SCHEMA}}
    return "/v1/chat/completions", body


def messages_request(rng: random.Random, stream: bool) -> tuple[str, dict]:
    body: dict = {"model": "tiny", "max_tokens": rng.randint(4, 24), "stream": stream,
                  "messages": [{"role": "user", "content": rng.choice(PROMPTS)}]}
    if rng.random() < 0.7:  # none named: Anthropic's default, temperature 1
        body["temperature"] = rng.choice([0, 0.7, 1])
    for name, values in (("top_p", [0.1, 0.9]), ("top_k", [1, 40])):
        if rng.random() < 0.3:
            body[name] = rng.choice(values)
    kind = rng.choice(["none", "auto", "any", "tool"])
    if kind != "none":
        body["tools"] = [{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]} for t in (WEATHER, LOOKUP)]
        body["tool_choice"] = {"type": kind, "name": "get_weather"} if kind == "tool" else {"type": kind}
    return "/v1/messages", body


def responses_request(rng: random.Random, stream: bool) -> tuple[str, dict]:
    body = {"input": rng.choice(PROMPTS), "max_output_tokens": rng.randint(4, 24), "stream": stream, "store": False}
    body.update(sampling(rng))
    kind = constraint(rng)
    if kind in ("auto", "required", "named"):
        body["tools"] = [{"type": "function", **WEATHER}, {"type": "function", **LOOKUP}]
        body["tool_choice"] = {"type": "function", "name": "get_weather"} if kind == "named" else kind
    elif kind == "json_object":
        body["text"] = {"format": {"type": "json_object"}}
    elif kind == "json_schema":
        body["text"] = {"format": {"type": "json_schema", "name": "reply", "schema": SCHEMA}}
    return "/v1/responses", body


def draw(rng: random.Random) -> tuple[str, dict]:
    api = rng.choice([chat_request, chat_request, messages_request, responses_request])
    return api(rng, rng.random() < 0.5)


# -- checking answers ------------------------------------------------------------------------------

TERMINAL = {  # the last event of a stream that ended properly
    "/v1/chat/completions": ("[DONE]",),
    "/v1/messages": ("message_stop", "error"),
    "/v1/responses": ("response.completed", "response.incomplete", "response.failed"),
}


def error_of(route: str, body: dict) -> dict:
    """The error object of an error body in the route's API shape (fails on any other shape)."""
    if route == "/v1/messages":
        assert body["type"] == "error" and isinstance(body["error"]["message"], str), body
        return body["error"]
    error = body["error"]
    assert isinstance(error["message"], str) and isinstance(error["type"], str) and "code" in error and "param" in error, body
    return error


def send(client: httpx.Client, url: str, route: str, body: dict) -> tuple[int, dict | None]:
    """Send one request and check its answer's shape; (status, the error object or None)."""
    if not body.get("stream"):
        response = client.post(url + route, json=body)
        payload = response.json()
        if response.status_code != 200:
            return response.status_code, error_of(route, payload)
        assert ("choices" in payload) if route == "/v1/chat/completions" else ("content" in payload) if route == "/v1/messages" else ("output" in payload), payload
        return 200, None
    with client.stream("POST", url + route, json=body) as response:
        if response.status_code != 200:
            response.read()
            return response.status_code, error_of(route, response.json())
        events, error = [], None
        for line in response.iter_lines():
            if line.startswith("event: "):
                events.append(line[len("event: "):])
            elif line.startswith("data: "):
                data = line[len("data: "):]
                if data == "[DONE]":
                    events.append(data)
                    continue
                chunk = json.loads(data)
                if "error" in chunk and route != "/v1/responses":
                    error = error_of(route, chunk)
                elif route == "/v1/responses" and chunk.get("type") == "error":
                    error = chunk
        assert events and events[-1] in TERMINAL[route], f"{route}: the stream ended with {events[-3:]}"
        return 200, error


def soak(servers: dict[str, ServerProcess], seed: int) -> dict[str, list]:
    rng = random.Random(seed)
    jobs = [(name, *draw(rng)) for name in SERVERS for _ in range(REQUESTS.get(name, N_REQUESTS))]
    rng.shuffle(jobs)
    answers: dict[str, list] = {name: [] for name in SERVERS}
    with httpx.Client(timeout=120) as client, concurrent.futures.ThreadPoolExecutor(CONCURRENCY) as pool:
        futures = {pool.submit(send, client, servers[name].url, route, body): (name, route, body) for name, route, body in jobs}
        for future in concurrent.futures.as_completed(futures):
            name, route, body = futures[future]
            try:
                status, error = future.result()
            except Exception as exc:  # noqa: BLE001 - collected: a dead server shows as many of these
                status, error = -1, {"message": f"{type(exc).__name__}: {exc}"}
            answers[name].append((status, error, route, body))
    return answers


def test_random_requests_on_random_and_broken_models_all_get_answers_and_no_server_aborts(servers):
    t0 = time.monotonic()
    answers = soak(servers, seed=0)
    elapsed = time.monotonic() - t0
    problems = []
    for name, got in answers.items():
        poisoned = SERVERS[name][1] is not None
        for status, error, route, body in got:
            if status == -1:
                problems.append(f"{name} {route}: no answer: {error['message']} for {json.dumps(body)[:300]}")
            elif poisoned and not (status in (200, 500) and error is not None and "the model's logits" in error["message"]):
                problems.append(f"{name} {route}: {status} {error} for {json.dumps(body)[:300]}")
            elif not poisoned and status >= 500:
                problems.append(f"{name} {route}: {status} {error} for {json.dumps(body)[:300]}")
    for name, server in servers.items():
        if server.proc.poll() is not None:
            problems.append(f"{name}: the server exited with {server.proc.returncode}")
        elif httpx.get(server.url + "/health", timeout=10).status_code != 200:
            problems.append(f"{name}: /health is not 200")
        log = server.output()
        if "warmslot crash:" in log or "GGML_ASSERT" in log:
            problems.append(f"{name}: the log has a crash report:\n{log[-3000:]}")
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:20])
    statuses = sorted({(name, s) for name, got in answers.items() for s, *_ in got})
    print(f"soak: {sum(len(g) for g in answers.values())} requests in {elapsed:.0f} s; statuses {statuses}")
    errors = [e for got in answers.values() for s, e, *_ in got if e]
    assert any("logit_bias removes every token" in e["message"] for e in errors)  # the emptied set was drawn
    assert any(s == 200 for got in answers.values() for s, *_ in got)


# -- what a client sees ----------------------------------------------------------------------------

HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("temperature", [0, 1])
def test_nan_logits_fail_each_request_in_its_api_shape(servers, temperature):
    """Before the fix, temperature 1 aborted the server (GGML_ASSERT(cur_p->size > 0)) and
    temperature 0 answered token 0 over and over."""
    url = servers["nan"].url
    with httpx.Client(timeout=60) as client:
        for stream in (False, True):
            status, error = send(client, url, "/v1/chat/completions", {"messages": HI, "max_tokens": 4, "temperature": temperature, "stream": stream})
            assert status == 500 and error["type"] == "server_error" and error["code"] == "invalid_logits", error
            assert "reply token 0" in error["message"] and "NaN" in error["message"]
            body = {"model": "m", "messages": HI, "max_tokens": 4, "stream": stream}  # Anthropic's default: temperature 1
            if temperature == 0:
                body["temperature"] = 0
            status, error = send(client, url, "/v1/messages", body)
            assert status in (200, 500) and error["type"] == "api_error" and "NaN" in error["message"], (status, error)
            status, error = send(client, url, "/v1/responses", {"input": "hi", "max_output_tokens": 4, "temperature": temperature, "stream": stream})
            assert status in (200, 500) and "NaN" in str(error), (status, error)
        completion = client.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 4, "temperature": temperature})
        assert completion.status_code == 500 and completion.json()["error"]["code"] == "invalid_logits"
    assert httpx.get(url + "/health").status_code == 200


def test_a_grammar_dead_end_and_an_emptied_candidate_set_are_the_requests_error(servers):
    """A forced Hermes call starts with "<": banned, the grammar allows nothing (before the
    fix: llama.cpp's grammar asked to accept a token it forbids, and the process aborted)."""
    url = servers["hermes"].url
    tools = [{"type": "function", "function": WEATHER}]
    with httpx.Client(timeout=60) as client:
        body = {"messages": HI, "max_tokens": 8, "tools": tools, "tool_choice": "required", "logit_bias": {"60": -100}}
        status, error = send(client, url, "/v1/chat/completions", body)
        assert status == 400 and error["type"] == "invalid_request_error", error
        assert "the grammar and logit_bias allow no token here" in error["message"] and "reply token 0" in error["message"]
        body = {"messages": HI, "max_tokens": 8, "logit_bias": {str(t): -100 for t in range(N_VOCAB)}}
        status, error = send(client, url, "/v1/chat/completions", body)
        assert status == 400 and "logit_bias removes every token" in error["message"], error
        ok = client.post(url + "/v1/chat/completions", json={"messages": HI, "max_tokens": 4})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1
