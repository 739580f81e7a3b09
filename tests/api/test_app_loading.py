"""Before the model is ready, every endpoint that needs it answers 503 with Retry-After."""

from starlette.testclient import TestClient

from warmslot.server.app import create_app
from warmslot.server.process.config import parse_config


def test_health_and_requests_answer_503_while_loading():
    config, _ = parse_config(["-m", "/nonexistent.gguf"])
    app = create_app(config)
    client = TestClient(app)  # no lifespan: the engine never starts, so it stays "loading"
    r = client.get("/health")
    assert r.status_code == 503
    assert r.headers["retry-after"]
    assert r.json()["status"] == "loading"
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "loading"
    r = client.get("/v1/models")
    assert r.status_code == 200
