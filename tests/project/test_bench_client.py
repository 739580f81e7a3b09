"""The benchmarks' one streaming client reads chat and completion streams alike, for the CPU
scripts (a StreamResult) and the GPU harness (its plain record), and the page-cache helper
takes a file or a directory. No server: the streams are scripted."""

import json

import httpx

from scripts.bench_client import stream_request
from scripts.gpu_bench.client import request_record
from scripts.page_cache import drop_page_cache


def sse(*events: dict) -> bytes:
    return b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"


def client_for(body: bytes, status: int = 200, seen: list | None = None) -> httpx.Client:
    def handle(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(json.loads(request.content))
        return httpx.Response(status, content=body, headers={"x-warmslot-cache": "source=slot;cached=3"})

    return httpx.Client(transport=httpx.MockTransport(handle))


CHAT = sse(
    {"choices": [{"index": 0, "delta": {"role": "assistant"}}]},
    {"choices": [{"index": 0, "delta": {"reasoning_content": "think"}}]},
    {"choices": [{"index": 0, "delta": {"content": "Hi"}}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f"}}]}}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}}]},
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5,
                              "prompt_tokens_details": {"cached_tokens": 3}}},
)


def test_a_chat_stream_gives_parts_counts_and_the_request_asks_for_usage():
    seen: list = []
    r = stream_request("http://x", "/v1/chat/completions", {"messages": []}, client=client_for(CHAT, seen=seen))
    assert seen[0]["stream"] is True and seen[0]["stream_options"] == {"include_usage": True}
    assert r.ok and r.status == 200 and r.token_chunks == 4 and len(r.chunk_times) == 4
    assert (r.text, r.content, r.reasoning) == ("thinkHif{}", "Hi", "think")
    assert r.tool_calls == [{"id": "c1", "name": "f", "arguments": "{}"}]
    assert (r.prompt_tokens, r.cached_tokens, r.completion_tokens, r.finish_reason) == (10, 3, 5, "tool_calls")
    assert r.ttft_s <= r.total_s
    assert "content" not in r.summary() and "chunk_times" not in r.summary() and r.summary()["text"] == r.text
    rec = request_record(r.as_dict())
    assert (rec["computed_tokens"], rec["tool_calls"], rec["cache_header"]) == (7, ["f"], "source=slot;cached=3")


def test_a_completion_stream_without_usage_counts_its_chunks():
    body = sse({"choices": [{"text": "a"}]}, {"choices": [{"text": ""}]}, {"choices": [{"text": "b"}]},
               {"choices": [{"text": "", "finish_reason": "length"}], "timings": {"prompt_n": 4, "cache_n": 2}})
    r = stream_request("http://x", "/v1/completions", {"prompt": "p"}, client=client_for(body), keep_chunk_times=False)
    assert (r.content, r.completion_tokens, r.prompt_tokens, r.chunk_times) == ("ab", 2, 6, [])


def test_errors_end_the_result_not_ok():
    r = stream_request("http://x", "/v1/completions", {}, client=client_for(b"busy", status=503))
    assert not r.ok and r.status == 503 and r.error == "HTTP 503: busy"
    failed = sse({"error": {"message": "boom"}})
    r = stream_request("http://x", "/v1/completions", {}, client=client_for(failed))
    assert not r.ok and "boom" in r.error


def test_drop_page_cache_takes_a_file_or_a_directory(tmp_path):
    (tmp_path / "a").write_bytes(b"x" * 300)
    (tmp_path / "b").write_bytes(b"y" * 200)
    (tmp_path / "sub").mkdir()
    assert drop_page_cache(tmp_path / "a") == 300
    assert drop_page_cache(tmp_path) == 500
