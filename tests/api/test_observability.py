"""Metrics agree with usage; misses are explained at the right message and token; /slots
shows checkpoints. The real server on the default model (a sliding-window model)."""

import json
import pathlib

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import warmslot_server

pytestmark = [pytest.mark.model, pytest.mark.server]

METRICS_PAGE = (pathlib.Path(__file__).parents[2] / "docs" / "metrics.md").read_text()


@pytest.fixture(scope="module")
def server(default_model):
    proc = warmslot_server(default_model, "-np", "1", "-c", "4096")
    yield proc
    proc.stop()


def scrape(server) -> dict[tuple[str, tuple], float]:
    text = httpx.get(server.url + "/metrics").text
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(metrics, name, **labels) -> float:
    return metrics.get((name, tuple(sorted(labels.items()))), 0.0)


def chat(server, messages, **extra):
    body = {"messages": messages, "max_tokens": 8, "temperature": 0, "warmslot_explain": True, **extra}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r


def test_metrics_count_every_prompt_token_by_source_and_agree_with_usage(server):
    before = scrape(server)
    system = {"role": "system", "content": "You are a terse assistant. " * 20}
    conversations = [
        [system, {"role": "user", "content": "Name a color."}],
        [system, {"role": "user", "content": "Name a color."}],  # an exact repeat
        [system, {"role": "user", "content": "Name a fruit."}],  # shares the system prompt
    ]
    usages = [chat(server, m).json()["usage"] for m in conversations]
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 3}, timeout=60)
    usages.append(r.json()["usage"])
    after = scrape(server)

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    sources = ("slot", "fork", "ram", "disk", "computed")
    prompt_total = sum(delta("warmslot_prompt_tokens_total", source=s) for s in sources)
    assert prompt_total == sum(u["prompt_tokens"] for u in usages)
    cached = sum(delta("warmslot_prompt_tokens_total", source=s) for s in ("slot", "fork", "ram", "disk"))
    assert cached == sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    assert delta("warmslot_prompt_tokens_total", source="computed") == sum(
        u["prompt_tokens"] - u["prompt_tokens_details"]["cached_tokens"] for u in usages
    )
    assert delta("warmslot_generated_tokens_total") == sum(u["completion_tokens"] for u in usages)
    assert delta("warmslot_requests_total", endpoint="chat", status="200") == 3
    assert delta("warmslot_requests_total", endpoint="completions", status="200") == 1
    assert delta("warmslot_time_to_first_token_seconds_count") == 4
    assert delta("warmslot_logits_reused_total") == 1  # the exact repeat evaluated nothing
    assert value(after, "warmslot_slots", state="idle") == 1
    assert value(after, "warmslot_kv_cells_total") == 4096
    assert value(after, "warmslot_prompt_cache_budget_bytes") > 0
    (info,) = [dict(labels) for (metric, labels), v in after.items() if metric == "warmslot_model_info" and v == 1]
    assert info["arch"] == "gemma3" and info["memory"] == "swa" and info["slots"] == "1"


def test_requests_of_the_apis_that_declare_their_labels_are_counted_under_them(server):
    """The rerank API and the load balancer's routes give /metrics their endpoint labels."""
    before = scrape(server)
    assert httpx.post(server.url + "/v1/rerank", json={"query": "q", "documents": ["d"]}, timeout=60).status_code == 501
    assert httpx.get(server.url + "/get_load", timeout=60).status_code == 200
    after = scrape(server)

    def delta(**labels):
        return value(after, "warmslot_requests_total", **labels) - value(before, "warmslot_requests_total", **labels)

    assert delta(endpoint="rerank", status="501") == 1
    assert delta(endpoint="load", status="200") == 1


def test_every_metric_is_documented_in_docs_metrics(server):
    text = httpx.get(server.url + "/metrics").text
    names = {f.name for f in text_string_to_metric_families(text)}
    assert len(names) > 25
    for name in names:
        documented = name in METRICS_PAGE or f"{name}_total" in METRICS_PAGE or f"{name}_info" in METRICS_PAGE
        assert documented, name


def test_changed_timestamp_in_the_system_prompt_is_pinned_to_message_0(server):
    def history(stamp):
        return [
            {"role": "system", "content": f"Current time: 2026-11-26 {stamp}. You help with code."},
            {"role": "user", "content": "Explain what a mutex is, briefly."},
        ]

    chat(server, history("10:00:00"))
    r = chat(server, history("10:00:07"))
    cache = r.json()["warmslot"]["cache"]
    old = httpx.post(server.url + "/tokenize", json={"messages": history("10:00:00")}).json()["tokens"]
    new = httpx.post(server.url + "/tokenize", json={"messages": history("10:00:07")}).json()["tokens"]
    first_diff = next(i for i, (a, b) in enumerate(zip(old, new)) if a != b)
    where = cache["divergence"]
    assert where["token"] == first_diff
    assert where["message"] == 0 and where["role"] == "system"
    assert "7" in where["new"]
    # the old timestamp is the text of another prompt (which may have been anyone's): never quoted
    assert where["old"] is None
    assert cache["cached_tokens"] <= first_diff
    assert f"diverged={first_diff}" in r.headers["x-warmslot-cache"]
    assert "message=0" in r.headers["x-warmslot-cache"]


def test_rerendered_assistant_message_is_pinned_to_that_message(server):
    base = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "List three prime numbers."},
    ]
    first = chat(server, base, max_tokens=12).json()
    reply = first["choices"][0]["message"]["content"]
    # the client keeps the reply, asks a follow-up; then rebuilds the history with the
    # assistant message rewritten (as agents that re-render tool calls do)
    chat(server, base + [{"role": "assistant", "content": reply}, {"role": "user", "content": "Thanks!"}])
    rewritten = base + [{"role": "assistant", "content": "2, 3 and 5."}, {"role": "user", "content": "Thanks!"}]
    cache = chat(server, rewritten).json()["warmslot"]["cache"]
    where = cache["divergence"]
    assert where["message"] == 2 and where["role"] == "assistant"
    assert "2, 3" in where["new"]
    # everything before the rewritten message was still reused
    assert cache["cached_tokens"] == where["token"]


def test_slots_show_checkpoints_after_a_prefill_on_a_sliding_window_model(server):
    r = chat(server, [{"role": "user", "content": "Say something about checkpoints."}])
    n_prompt = r.json()["usage"]["prompt_tokens"]
    view = httpx.get(server.url + "/engine").json()
    assert view["memory"] == "swa"
    slot = view["slots"][0]
    assert slot["state"] == "idle"
    assert slot["n_tokens"] >= n_prompt
    assert len(slot["content_hash"]) == 12
    at_end = [c for c in slot["checkpoints"] if c["n_tokens"] == n_prompt]
    assert at_end and at_end[0]["bytes"] > 0 and at_end[0]["logits"]
    assert view["cache"]["budget_bytes"] > 0


def test_rewritten_tool_call_is_pinned_to_its_assistant_message(server):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]

    def history(city):
        call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}
        return [
            {"role": "system", "content": "Use tools."},
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            {"role": "user", "content": "And tomorrow?"},
        ]

    chat(server, history("Paris"), tools=tools)
    cache = chat(server, history("Lyon"), tools=tools).json()["warmslot"]["cache"]
    where = cache["divergence"]
    assert where["message"] == 2 and where["role"] == "assistant"
    assert "Lyon" in where["new"]
    assert where["old"] is None and "Paris" not in json.dumps(cache)
