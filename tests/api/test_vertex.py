"""Vertex AI's prediction protocol (AIP_MODE=PREDICTION): the port and routes come from the
environment, and /predict runs each instance through the route its @requestFormat names."""

import httpx
import pytest

from scripts.server_process import ServerProcess, free_port, warmslot_command
from tests.helpers import THREADS
from warmslot.server.api.vertex.route import from_env, request_format

pytestmark = [pytest.mark.model, pytest.mark.server]


def test_settings_and_route_names_follow_vertex_ai():
    assert from_env({}) is None
    v = from_env({"AIP_MODE": "PREDICTION", "AIP_PREDICT_ROUTE": "infer", "AIP_HEALTH_ROUTE": "/ping"})
    assert (v.port, v.predict_route, v.health_route) == (8080, "/infer", "/ping")
    assert request_format("/v1/chat/completions") == "chatCompletions"
    assert request_format("/apply-template") == "applyTemplate"
    assert request_format("/v1/messages/count_tokens") == "messagesCountTokens"


@pytest.fixture(scope="module")
def server(tiny_models):
    port = free_port("127.0.0.1")
    env = {"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": str(port), "AIP_HEALTH_ROUTE": "/ping"}
    # --port says otherwise: AIP_HTTP_PORT wins, as Vertex AI needs
    proc = ServerProcess("warmslot", warmslot_command(tiny_models["attention"], ["-t", str(THREADS), "-np", "2", "-c", "512"]),
                         port=port, env=env, ready_timeout=180, listen=lambda host, _port: ["--host", host, "--port", "1"])
    yield proc
    proc.stop()


def test_predict_runs_each_instance_on_its_route(server):
    messages = [{"role": "user", "content": "hello"}]
    r = httpx.post(f"{server.url}/predict", timeout=120, json={"instances": [
        {"@requestFormat": "chatCompletions", "max_tokens": 4, "temperature": 0, "messages": messages, "stream": True},
        {"@requestFormat": "/v1/completions", "max_tokens": 4, "temperature": 0, "prompt": "hi"},
        {"@requestFormat": "tokenize", "content": "hi"},
        {"@requestFormat": "chatCompletions", "messages": "not a list"},
        {"@requestFormat": "nowhere"},
        {"no": "format"},
    ]})
    assert r.status_code == 200, r.text
    chat, completion, tokens, bad, unknown, missing = r.json()["predictions"]
    direct = httpx.post(f"{server.url}/v1/chat/completions", json={"max_tokens": 4, "temperature": 0, "messages": messages}).json()
    assert chat["object"] == "chat.completion" and chat["choices"][0]["message"] == direct["choices"][0]["message"]
    assert completion["object"] == "text_completion" and tokens["tokens"]
    assert bad["error"]["type"] == "invalid_request_error"
    assert "nowhere" in unknown["error"]["message"] and "@requestFormat" in missing["error"]["message"]
    assert httpx.get(f"{server.url}/ping").status_code == 200


@pytest.mark.parametrize("body", [{"instances": {}}, {"nothing": []}, {"instances": [{}] * 129}])
def test_predict_needs_an_array_of_instances(server, body):
    r = httpx.post(f"{server.url}/predict", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "instances"
