"""--sleep-idle-seconds on the default model: idle, the model is unloaded (reads still answer
and do not wake it); the next request that needs the model loads it again, and a conversation
from before the sleep comes back from the prompt cache, answering as a cold run does."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.helpers import metric, warmslot_server

pytestmark = [pytest.mark.model, pytest.mark.server]

TURN = [{"role": "user", "content": "Name three colors of the rainbow."}]


@pytest.fixture(scope="module")
def server(default_model):
    proc = warmslot_server(default_model, "-np", "1", "-c", "1024", "--sleep-idle-seconds", "1")
    yield proc
    proc.stop()


def asleep(url: str) -> bool:
    return httpx.get(url + "/props").json()["is_sleeping"]


def wait_asleep(url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not asleep(url):
        assert time.monotonic() < deadline, "the server did not go to sleep"
        time.sleep(0.1)


def chat(url: str, messages, **extra) -> dict:
    r = httpx.post(url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 12, "temperature": 0, **extra}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_conversation_comes_back_warm_after_the_model_slept(server):
    url = server.url
    first = chat(url, TURN)
    wait_asleep(url)
    wakes = metric(server, "warmslot_wakes_total")  # the server may have slept before the first turn too
    # reads answer from what the server keeps, and leave it asleep
    assert httpx.get(url + "/health").status_code == 200
    assert httpx.get(url + "/v1/models").status_code == 200
    view = httpx.get(url + "/engine").json()
    assert view["slots"] == [] and view["cache"]["n_entries"] == 1  # the slot's contents moved to RAM
    assert metric(server, "warmslot_asleep") == 1 and asleep(url)
    # the next turn wakes the model and its prefix comes from the prompt cache
    turn2 = TURN + [{"role": "assistant", "content": first["choices"][0]["message"]["content"]}, {"role": "user", "content": "And two more?"}]
    warm = chat(url, turn2)
    assert not asleep(url)
    assert metric(server, "warmslot_wakes_total") == wakes + 1
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] >= first["usage"]["prompt_tokens"]
    assert metric(server, 'warmslot_prompt_tokens_total{source="ram"}') >= first["usage"]["prompt_tokens"]
    cold = chat(url, turn2, cache_prompt=False)
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert warm["choices"][0]["message"]["content"] == cold["choices"][0]["message"]["content"]


def test_tokenize_wakes_the_model_and_a_stream_keeps_it_awake(server):
    url = server.url
    wait_asleep(url)
    r = httpx.post(url + "/tokenize", json={"content": "Hello"})
    assert r.status_code == 200 and r.json()["tokens"]
    assert not asleep(url)
    # a generation longer than the idle time is never cut by a sleep
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=120, json={
        "messages": TURN, "max_tokens": 150, "temperature": 0, "stream": True, "ignore_eos": True,
    }) as stream:
        chunks = [line for line in stream.iter_lines() if line.startswith("data: ")]
        assert not asleep(url)
    assert chunks[-1] == "data: [DONE]" and len(chunks) > 140
