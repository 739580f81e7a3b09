"""The generation pipeline, driven through the real app by a scripted engine (tests/fake_engine.py).

Every API is an adapter over one pipeline, so every stream ends with its API's terminal
event whatever fails: an engine error (a deadline) or a bug while the reply is built.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
import uvicorn

from tests.fake_engine import FakeEngine, fail, reply
from scripts.server_process import free_port
from warmslot.server.app import create_app
from warmslot.server.process.config import parse_config
from warmslot.slots import ErrorKind, FinishReason

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
BODIES = {
    "/v1/chat/completions": {"messages": MESSAGES, "max_tokens": 8},
    "/v1/completions": {"prompt": "Once upon", "max_tokens": 8},
    "/v1/responses": {"input": MESSAGES, "max_output_tokens": 8},
}


class FakeServer:
    """The real app on a loopback port, its engine scripted."""

    def __init__(self, engine: FakeEngine, *flags: str) -> None:
        config, _ = parse_config(["-m", "/nonexistent.gguf", *flags])
        self.engine = engine
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        app = create_app(config, engine=engine)
        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def __enter__(self) -> "FakeServer":
        self._thread.start()
        deadline = time.monotonic() + 30
        while httpx.get(self.url + "/health").status_code != 200 if self._server.started else True:
            assert time.monotonic() < deadline, "the app did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(30)

    def post(self, path: str, body: dict) -> httpx.Response:
        return httpx.post(self.url + path, json=body, timeout=30)

    def stream(self, path: str, body: dict) -> list[tuple[str | None, str]]:
        """(event name, data) of each SSE event."""
        out, name = [], None
        with httpx.stream("POST", self.url + path, json=dict(body, stream=True), timeout=30) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("event:"):
                    name = line[6:].strip()
                elif line.startswith("data:"):
                    out.append((name, line[5:].strip()))
                    name = None
        return out


@pytest.fixture
def server():
    with FakeServer(FakeEngine()) as s:
        yield s


def _with_n(path: str, n: int) -> dict:
    return dict(BODIES[path], n=n) if n > 1 else BODIES[path]


CASES = [(path, n) for path in ("/v1/chat/completions", "/v1/completions") for n in (1, 2)] + [("/v1/responses", 1)]


def _assert_stream_terminal(path: str, events: list, error_type: str) -> None:
    if path == "/v1/responses":
        names = [name for name, _ in events]
        assert names[-2:] == ["error", "response.failed"], names
        failed = json.loads(events[-1][1])["response"]
        assert failed["status"] == "failed" and failed["error"]["message"]
    else:
        assert events[-1][1] == "[DONE]", events[-3:]
        assert json.loads(events[-2][1])["error"]["type"] == error_type


@pytest.mark.parametrize("path,n", CASES)
def test_a_stream_that_fails_while_its_body_is_built_ends_with_its_api_terminal_event(server, monkeypatch, path, n):
    def broken(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr("warmslot.server.pipeline.generation.total_usage", broken)
    _assert_stream_terminal(path, server.stream(path, _with_n(path, n)), "server_error")
    plain = server.post(path, _with_n(path, n))
    assert plain.status_code == 500
    assert plain.json()["error"]["message"] == "internal error: RuntimeError"
    monkeypatch.undo()
    assert server.post(path, _with_n(path, n)).status_code == 200  # and the server goes on


@pytest.mark.parametrize("path,n", CASES)
def test_an_engine_error_mid_stream_ends_with_its_api_terminal_event(server, path, n):
    server.engine.script = fail(after=2)
    _assert_stream_terminal(path, server.stream(path, _with_n(path, n)), "timeout_error")
    plain = server.post(path, _with_n(path, n))
    assert plain.status_code == 408
    assert plain.json()["error"]["code"] == "request_timeout"


@pytest.mark.parametrize("path,n", CASES)
def test_logits_that_cannot_be_sampled_mid_stream_end_with_its_api_terminal_event(server, path, n):
    message = "no token can be sampled for reply token 2 (0-based): the model's logits hold a NaN"
    server.engine.script = fail(after=2, kind=ErrorKind.MODEL_OUTPUT, message=message)
    _assert_stream_terminal(path, server.stream(path, _with_n(path, n)), "server_error")
    plain = server.post(path, _with_n(path, n))
    assert plain.status_code == 500
    assert plain.json()["error"]["code"] == "invalid_logits" and plain.json()["error"]["message"] == message


def test_every_choice_ends_with_a_finish_then_the_usage_then_done(server):
    events = server.stream("/v1/chat/completions", dict(BODIES["/v1/chat/completions"], n=2, stream_options={"include_usage": True}))
    chunks = [json.loads(data) for _, data in events[:-1]]
    assert events[-1][1] == "[DONE]"
    finishes = {c["choices"][0]["index"]: c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]}
    assert finishes == {0: "stop", 1: "stop"}
    usage = chunks[-1]["usage"]
    n_prompt = len(server.engine.submitted[0].tokens)
    assert usage["prompt_tokens"] == n_prompt  # the prompt once, not once per choice
    assert usage["completion_tokens"] == 4  # two pieces in each of the two choices


def test_a_reply_the_token_limit_ends_is_length_in_every_api(server):
    server.engine.script = reply("a", "b", finish=FinishReason.LENGTH)
    assert server.post("/v1/chat/completions", BODIES["/v1/chat/completions"]).json()["choices"][0]["finish_reason"] == "length"
    assert server.post("/v1/completions", BODIES["/v1/completions"]).json()["choices"][0]["finish_reason"] == "length"
    body = server.post("/v1/responses", BODIES["/v1/responses"]).json()
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}


def test_chat_and_responses_submit_the_same_prompt_tokens_for_one_conversation(server):
    server.post("/v1/chat/completions", BODIES["/v1/chat/completions"])
    server.post("/v1/responses", BODIES["/v1/responses"])
    chat, responses = server.engine.submitted[-2:]
    assert chat.tokens == responses.tokens
    assert chat.boundaries == responses.boundaries  # and checkpoints at the same places


def test_a_context_overflow_names_each_apis_prompt_field():
    with FakeServer(FakeEngine(n_ctx_slot=8)) as s:
        s.engine.submit = _reject_context(s.engine)
        for path, param in (("/v1/chat/completions", "messages"), ("/v1/completions", "prompt"), ("/v1/responses", "input")):
            r = s.post(path, BODIES[path])
            assert r.status_code == 400, path
            assert r.json()["error"]["param"] == param, path


def _reject_context(engine: FakeEngine):
    from warmslot.slots import EngineError, ErrorKind, Rejected

    def submit(req):
        raise Rejected(EngineError(ErrorKind.CONTEXT, "too long"))

    return submit


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_the_client_leaves_is_aborted_and_logged(caplog, stream):
    body = dict(BODIES["/v1/chat/completions"], stream=stream)
    with FakeServer(FakeEngine(reply(*["word "] * 200), delay_s=0.02)) as s, caplog.at_level("INFO", logger="warmslot.server"):
        if stream:
            with httpx.stream("POST", s.url + "/v1/chat/completions", json=body, timeout=30) as r:
                assert next(r.iter_lines()).startswith("data:")
            # leaving the block closed the connection mid-stream
        else:
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(s.url + "/v1/chat/completions", json=body, timeout=httpx.Timeout(30, read=0.3))
        deadline = time.monotonic() + 10
        while not (s.engine.submitted and s.engine.submitted[0].id in s.engine.aborted):
            assert time.monotonic() < deadline, "the request was not aborted"
            time.sleep(0.02)
        while "chat: the client disconnected" not in caplog.text:
            assert time.monotonic() < deadline, "the disconnect was not logged"
            time.sleep(0.02)
