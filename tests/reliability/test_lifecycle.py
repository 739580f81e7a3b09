"""Deadlines and graceful shutdown, end to end: the real server process on the default model.

SIGTERM drains: new requests and /health get 503, queued requests fail at once with 503,
running ones finish (or, after --shutdown-timeout, end with an error event and [DONE]), and
the process exits with 0. A request's `timeout` (or --request-timeout) ends it with a 408."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
import pytest

from tests.helpers import warmslot_server

pytestmark = [pytest.mark.model, pytest.mark.server]

HELLO = [{"role": "user", "content": "Write a long story about the sea."}]
LONG = {"messages": HELLO, "max_tokens": 1500, "temperature": 0, "ignore_eos": True}


class Stream:
    """An SSE stream read on a thread: its data lines, as they come."""

    def __init__(self, url: str, body: dict) -> None:
        self.lines: list[str] = []
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._read, args=(url, body), daemon=True)
        self._thread.start()

    def _read(self, url, body) -> None:
        try:
            with httpx.stream("POST", url + "/v1/chat/completions", json=dict(body, stream=True), timeout=180) as r:
                assert r.status_code == 200, r.read()
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        self.lines.append(line[6:])
        except BaseException as exc:  # noqa: BLE001 - read by the test
            self.error = exc

    def wait_chunks(self, n: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while len(self.lines) < n:
            assert self.error is None and time.monotonic() < deadline, self.error
            time.sleep(0.02)

    def running(self) -> bool:
        return self._thread.is_alive() and "[DONE]" not in self.lines

    def join(self, timeout: float = 180) -> list[str]:
        self._thread.join(timeout)
        assert not self._thread.is_alive() and self.error is None, self.error
        return self.lines


def queue_depth(url: str) -> int:
    return httpx.get(url + "/engine").json()["queue_depth"]


def wait_for(predicate, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_sigterm_drains_then_ends_running_streams_with_an_error_and_done_and_exits_0(default_model):
    proc = warmslot_server(default_model, "-np", "1", "-c", "2048", "--shutdown-timeout", "8")
    try:
        stream = Stream(proc.url, LONG)
        stream.wait_chunks(3)
        queued: dict = {}
        waiter = threading.Thread(target=lambda: queued.update(r=httpx.post(proc.url + "/v1/chat/completions", json=dict(LONG, max_tokens=4), timeout=120)))
        waiter.start()
        wait_for(lambda: queue_depth(proc.url) == 1)

        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        waiter.join(30)
        r = queued["r"]
        assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"
        assert stream.running()  # at once, not after the running request
        health = httpx.get(proc.url + "/health")  # still listening while it drains
        assert health.status_code == 503 and health.json()["status"] == "shutting_down"
        new = httpx.post(proc.url + "/v1/chat/completions", json=dict(LONG, max_tokens=2))
        assert new.status_code == 503 and new.json()["error"]["type"] == "unavailable_error"
        assert stream.running()

        lines = stream.join()
        assert time.monotonic() - t0 >= 8 - 0.5  # the running request had its --shutdown-timeout
        assert lines[-1] == "[DONE]"
        error = json.loads(lines[-2])["error"]
        assert error["code"] == "shutting_down" and error["type"] == "unavailable_error" and error["message"]
        assert any(json.loads(x).get("choices", [{}])[0].get("delta", {}).get("content") for x in lines[:-2])
        assert proc.proc.wait(60) == 0
    finally:
        proc.stop()


def test_sigterm_lets_a_running_request_finish_and_exits_0(default_model):
    proc = warmslot_server(default_model, "-np", "1", "-c", "2048")  # the default --shutdown-timeout: 30 s
    try:
        stream = Stream(proc.url, dict(LONG, max_tokens=40))
        stream.wait_chunks(2)
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        lines = stream.join()
        assert lines[-1] == "[DONE]"
        chunks = [json.loads(x) for x in lines[:-1]]
        assert not any("error" in c for c in chunks)
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert proc.proc.wait(60) == 0
        assert time.monotonic() - t0 < 30  # it exited once the request was done
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def timed(default_model):
    proc = warmslot_server(default_model, "-np", "1", "-c", "4096", "--request-timeout", "3")
    yield proc
    proc.stop()


def wait_idle(url: str) -> None:
    wait_for(lambda: all(s["state"] == "idle" for s in httpx.get(url + "/slots").json()), timeout=30)


def test_a_request_timeout_ends_a_plain_request_with_408_and_frees_the_slot(timed):
    t0 = time.monotonic()
    r = httpx.post(timed.url + "/v1/chat/completions", json=dict(LONG, max_tokens=3000, timeout=1), timeout=120)
    assert r.status_code == 408
    error = r.json()["error"]
    assert error["type"] == "timeout_error" and error["code"] == "request_timeout" and "1 s" in error["message"]
    assert r.headers["x-should-retry"] == "false"
    assert time.monotonic() - t0 < 30
    wait_idle(timed.url)
    ok = httpx.post(timed.url + "/v1/chat/completions", json={"messages": HELLO, "max_tokens": 2}, timeout=120)
    assert ok.status_code == 200


def test_a_request_timeout_ends_a_stream_with_an_error_event_and_done(timed):
    lines = Stream(timed.url, dict(LONG, max_tokens=3000, timeout=1)).join()
    assert lines[-1] == "[DONE]"
    assert json.loads(lines[-2])["error"]["code"] == "request_timeout"
    wait_idle(timed.url)


def test_the_server_wide_request_timeout_bounds_every_request(timed):
    t0 = time.monotonic()
    r = httpx.post(timed.url + "/v1/chat/completions", json=dict(LONG, max_tokens=3000, timeout=600), timeout=120)
    assert r.status_code == 408 and "3 s" in r.json()["error"]["message"]  # --request-timeout 3 wins
    assert 3 <= time.monotonic() - t0 < 30
    wait_idle(timed.url)


def test_a_queued_request_times_out_while_another_runs(timed):
    stream = Stream(timed.url, dict(LONG, max_tokens=3000))
    stream.wait_chunks(2)
    r = httpx.post(timed.url + "/v1/chat/completions", json={"messages": HELLO, "max_tokens": 2, "timeout": 0.5}, timeout=120)
    assert r.status_code == 408
    lines = stream.join()  # the running one ends at --request-timeout
    assert json.loads(lines[-2])["error"]["code"] == "request_timeout"
    wait_idle(timed.url)


@pytest.mark.parametrize("value", [0, -1, "5", None, True, 1e9])
def test_a_bad_timeout_is_a_400(timed, value):
    r = httpx.post(timed.url + "/v1/completions", content=json.dumps({"prompt": "x", "timeout": value}).encode() if value is not None else b'{"prompt": "x", "timeout": NaN}')
    assert r.status_code == 400 and r.json()["error"]["param"] in ("timeout", None)
