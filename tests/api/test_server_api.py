"""End to end: the real server on the default model, driven by the official OpenAI client."""

import concurrent.futures
import json
import time

import httpx
import openai
import pytest

from tests.helpers import warmslot_server

pytestmark = [pytest.mark.model, pytest.mark.server]

HELLO = [{"role": "user", "content": "Write one short sentence about the sea."}]


@pytest.fixture(scope="module")
def server(default_model):
    proc = warmslot_server(default_model, "-np", "2", "-c", "4096", "--max-queue", "8")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def slots_state(server) -> list[str]:
    return [s["state"] for s in httpx.get(server.url + "/slots").json()]


def wait_idle(server, timeout: float = 10.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = slots_state(server)
        if all(s == "idle" for s in states):
            return states
        time.sleep(0.05)
    return slots_state(server)


def test_slots_is_llama_servers_array_and_engine_the_whole_view(server, client):
    client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Count to three."}], max_tokens=2, temperature=0)
    wait_idle(server)
    slots = httpx.get(server.url + "/slots").json()
    assert [s["id"] for s in slots] == [0, 1]
    assert all(s["n_ctx"] == 2048 and s["is_processing"] is False and s["state"] == "idle" for s in slots)
    assert httpx.get(server.url + "/slots?fail_on_no_slot=1").status_code == 200  # a slot is idle
    view = httpx.get(server.url + "/engine").json()  # every sequence: the slots, then the spare streams
    ids = [s["id"] for s in view["slots"]]
    assert ids[:2] == [0, 1] and ids == list(range(len(ids))) and view["queue_depth"] == 0 and "cache" in view


def test_models_lists_the_loaded_model(client):
    models = client.models.list().data
    assert len(models) == 1
    assert models[0].id == "gemma-3-270m-q4_k_m.gguf"


def test_chat_completion_plain(client):
    r = client.chat.completions.create(model="x", messages=HELLO, max_tokens=12, temperature=0)
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    u = r.usage
    assert u.completion_tokens <= 12
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert 0 <= u.prompt_tokens_details.cached_tokens < u.prompt_tokens


def test_chat_completion_streamed_matches_plain(client):
    kw = dict(model="x", messages=HELLO, max_tokens=12, temperature=0)
    plain = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [plain.choices[0].finish_reason]
    usage = chunks[-1].usage
    assert chunks[-1].choices == []
    assert usage.prompt_tokens == plain.usage.prompt_tokens
    assert usage.completion_tokens == plain.usage.completion_tokens
    # the same prompt again: all of it comes from the slot
    assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens


def test_return_progress_and_timings_per_token_on_a_chat_stream(server):
    body = {"messages": [{"role": "user", "content": "List four fruits, one per line."}], "max_tokens": 6, "temperature": 0,
            "stream": True, "return_progress": True, "timings_per_token": True}

    def stream(b: dict) -> list[dict]:
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=b, timeout=60) as r:
            return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]

    cold = stream(dict(body, cache_prompt=False))
    progress = [c["prompt_progress"] for c in cold if "prompt_progress" in c]
    total = cold[-1]["timings"]["cache_n"] + cold[-1]["timings"]["prompt_n"]
    assert progress[0]["cache"] == progress[0]["processed"] == 0  # reported when the request got its slot
    assert progress[-1]["processed"] == progress[-1]["total"] == total
    assert [p["processed"] for p in progress] == sorted(p["processed"] for p in progress)
    assert all(c["choices"][0]["delta"] == {"role": "assistant", "content": None} for c in cold if "prompt_progress" in c)
    predicted = [c["timings"]["predicted_n"] for c in cold if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert predicted and predicted == sorted(predicted) and 1 <= predicted[-1] <= 6
    warm = stream(body)  # the same prompt: the slot holds it
    first = next(c["prompt_progress"] for c in warm if "prompt_progress" in c)
    assert first["cache"] == first["processed"] > 0 and first["total"] == total


def test_completions_with_text_and_token_ids(client):
    r = client.completions.create(model="x", prompt="The capital of France is", max_tokens=6, temperature=0)
    assert r.choices[0].text
    assert r.usage.completion_tokens <= 6
    ids = client.completions.create(model="x", prompt=[2, 818, 5279, 529, 7001, 563], max_tokens=6, temperature=0)
    assert ids.usage.prompt_tokens == 6
    assert ids.choices[0].text


def test_completions_streamed(client):
    chunks = list(client.completions.create(model="x", prompt="Once upon a time", max_tokens=8, temperature=0, stream=True))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    plain = client.completions.create(model="x", prompt="Once upon a time", max_tokens=8, temperature=0)
    assert text == plain.choices[0].text


def test_stop_string_ends_generation_without_emitting_it(client):
    base = client.completions.create(model="x", prompt="1, 2, 3, 4,", max_tokens=12, temperature=0).choices[0].text
    assert len(base) > 4
    stop = base[2:4]
    r = client.completions.create(model="x", prompt="1, 2, 3, 4,", max_tokens=12, temperature=0, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == base[: base.index(stop)]


def test_usage_adds_up_across_sources(server):
    body = {"messages": HELLO, "max_tokens": 4, "temperature": 0, "warmslot_explain": True}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).json()
    cache = r["warmslot"]["cache"]
    assert cache["cached_tokens"] == r["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert set(cache["state_bytes"]) == {"device_to_ram", "ram_to_device", "disk_to_ram"}
    assert all(isinstance(n, int) and n >= 0 for n in cache["state_bytes"].values())
    assert r["usage"]["total_tokens"] == r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"]


def test_four_concurrent_requests_on_two_slots(client, server):
    def ask(i):
        return client.chat.completions.create(
            model="x", messages=[{"role": "user", "content": f"Count to {i + 3}."}], max_tokens=16, temperature=0
        )

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(ask, range(4)))
    assert all(r.choices[0].message.content for r in results)
    assert all(r.usage.completion_tokens > 0 for r in results)
    assert wait_idle(server) == ["idle", "idle"]


def test_client_disconnect_frees_the_slot(client, server):
    # ignore_eos is an extension the OpenAI client sends through extra_body
    stream = client.chat.completions.create(
        model="x", messages=HELLO, max_tokens=2000, temperature=0, stream=True, extra_body={"ignore_eos": True}
    )
    got = 0
    for _chunk in stream:
        got += 1
        if got == 5:
            break
    assert "decode" in slots_state(server)
    stream.close()
    assert wait_idle(server) == ["idle", "idle"]
    # and the server still answers
    r = client.chat.completions.create(model="x", messages=HELLO, max_tokens=2, temperature=0)
    assert r.usage.completion_tokens >= 1


def test_nonstreaming_client_disconnect_frees_the_slot(server):
    body = {"messages": HELLO, "max_tokens": 2000, "temperature": 0, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/chat/completions", json=body, timeout=0.5)
    assert wait_idle(server) == ["idle", "idle"]


@pytest.mark.parametrize(
    "body, param",
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (b"", None),
        (json.dumps({"messages": "hi"}).encode(), "messages"),
        (json.dumps({"messages": []}).encode(), "messages"),
        (json.dumps({"messages": [{"role": "robot", "content": "x"}]}).encode(), "messages[0].role"),
        (json.dumps({"messages": HELLO, "temperature": "hot"}).encode(), "temperature"),
        (json.dumps({"messages": HELLO, "max_tokens": -1}).encode(), "max_tokens"),
        (json.dumps({"messages": HELLO, "n": 9}).encode(), "n"),  # above --max-n
        (json.dumps({"messages": HELLO, "logprobs": True, "top_logprobs": 21}).encode(), "top_logprobs"),
        (json.dumps({"messages": HELLO, "top_logprobs": 2}).encode(), "top_logprobs"),
        (json.dumps({"messages": HELLO, "stop": [1]}).encode(), "stop"),
        (json.dumps({"messages": HELLO, "logit_bias": {"abc": 1}}).encode(), "logit_bias"),
        (json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}).encode(), "messages[0].content[0].image_url"),
    ],
)
def test_bad_chat_input_gets_400_with_the_field_named(server, body, param):
    r = httpx.post(server.url + "/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"]
    assert error["param"] == param


@pytest.mark.parametrize(
    "body, param",
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": [1, "a"]}, "prompt"),
        ({"prompt": [10**9]}, "prompt"),
        ({"prompt": ["a", ""]}, "prompt[1]"),
        ({"prompt": "x", "echo": True, "logprobs": 1}, "echo"),
        ({"prompt": "x", "logprobs": 6}, "logprobs"),
    ],
)
def test_bad_completion_input_gets_400(server, body, param):
    r = httpx.post(server.url + "/v1/completions", json=body)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == param


def test_prompt_longer_than_the_context_is_rejected(client, server):
    long = "word " * 5000
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="x", messages=[{"role": "user", "content": long}], max_tokens=4)
    error = info.value.body
    assert error["code"] == "exceed_context_size_error"
    assert error["n_ctx"] == 2048  # -c 4096 with two slots: a stream of 2048 cells each
    assert error["n_prompt_tokens"] > 2048
    r = client.chat.completions.create(model="x", messages=HELLO, max_tokens=2)
    assert r.choices[0].message.content is not None


def test_unknown_route_and_method_get_openai_errors(server):
    r = httpx.get(server.url + "/v1/nothing")
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "not_found_error"
    r = httpx.get(server.url + "/v1/chat/completions")
    assert r.status_code == 405
    assert "error" in r.json()


def test_server_keeps_serving_after_bad_input(client, server):
    for _ in range(3):
        httpx.post(server.url + "/v1/chat/completions", content=b"{oops")
    r = client.chat.completions.create(model="x", messages=HELLO, max_tokens=3, temperature=0)
    assert r.usage.completion_tokens >= 1
    assert wait_idle(server) == ["idle", "idle"]


def test_huge_max_length_is_rejected_not_crashing(client, server):
    """A maxLength of 10^8 made llama.cpp's grammar parser overflow its stack: a segfault."""
    schema = {"type": "string", "maxLength": 100_000_000}
    response_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": HELLO, "response_format": response_format})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "response_format.json_schema.schema.maxLength"
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"s": schema}}}}]
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": HELLO, "tools": tools})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "tools[0].function.parameters.properties.s.maxLength"
    assert httpx.get(server.url + "/health").status_code == 200
    r = client.chat.completions.create(model="x", messages=HELLO, max_tokens=3, temperature=0)
    assert r.usage.completion_tokens >= 1


def test_full_queue_answers_503_with_retry_after(default_model):
    proc = warmslot_server(default_model, "-np", "1", "-c", "2048", "--max-queue", "1")
    try:
        # ~150 tokens hold the only slot for seconds on 2 cores, past the 0.8 s the others take to arrive
        body = {"messages": HELLO, "max_tokens": 150, "temperature": 0, "ignore_eos": True}
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            busy = pool.submit(httpx.post, proc.url + "/v1/chat/completions", json=body, timeout=120)
            time.sleep(0.5)  # the first request holds the only slot
            waiting = pool.submit(httpx.post, proc.url + "/v1/chat/completions", json=dict(body, max_tokens=2), timeout=120)
            time.sleep(0.3)  # the second one waits in the queue
            r = httpx.post(proc.url + "/v1/chat/completions", json=dict(body, max_tokens=2), timeout=120)
            assert r.status_code == 503
            assert r.headers["retry-after"]
            assert r.json()["error"]["code"] == "queue_full"
            assert busy.result().status_code == 200
            assert waiting.result().status_code == 200
    finally:
        proc.stop()


def test_api_key_is_required_when_set(default_model):
    proc = warmslot_server(default_model, "-np", "1", "-c", "1024", "--api-key", "sekret")
    try:
        r = httpx.post(proc.url + "/v1/chat/completions", json={"messages": HELLO, "max_tokens": 2})
        assert r.status_code == 401
        assert r.json()["error"]["type"] == "authentication_error"
        r = httpx.post(proc.url + "/v1/chat/completions", json={"messages": HELLO, "max_tokens": 2}, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
        ok = openai.OpenAI(base_url=proc.url + "/v1", api_key="sekret", max_retries=0)
        assert ok.chat.completions.create(model="x", messages=HELLO, max_tokens=2).usage.completion_tokens >= 1
        assert httpx.get(proc.url + "/health").status_code == 200
        assert httpx.get(proc.url + "/slots").status_code == 401
    finally:
        proc.stop()
