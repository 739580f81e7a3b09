"""The benchmarks' HTTP client: streamed OpenAI requests timed on the client, and plain GETs.

Both harnesses send their requests through `stream_request`: the CPU benchmarks read the
`StreamResult` it returns, the GPU harness (scripts/gpu_bench/) keeps its `as_dict()` in its
records. It works for /v1/completions and /v1/chat/completions on warmslot and llama-server
alike, and only speaks HTTP (httpx), so the driver never competes with the servers for the CPU
beyond reading their streams.

    r = stream_request(srv.url, "/v1/completions", {"prompt": "Hello", "max_tokens": 16})
    print(r.ttft_s, r.decode_tps)
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

ERROR_CHARS = 1500  # of an error body or error event kept in a result


@dataclass
class StreamResult:
    """Client-side timing of one streamed request (all times in seconds)."""

    ok: bool
    status: int | None
    error: str | None = None
    t_start: float = 0.0  # perf_counter when the request was sent
    ttft_s: float | None = None  # request sent -> first chunk carrying a token
    total_s: float | None = None  # request sent -> end of the stream
    decode_s: float | None = None  # first token chunk -> last token chunk
    token_chunks: int = 0  # chunks that carried generated text, reasoning or a tool-call delta
    prompt_tokens: int | None = None  # from usage, when the server reports it
    completion_tokens: int | None = None  # from usage, else token_chunks
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    decode_tps: float | None = None  # (completion_tokens - 1) / decode_s
    finish_reason: str | None = None
    text: str = ""  # everything generated, in arrival order (content, reasoning, tool calls)
    usage: dict | None = None
    timings: dict | None = None  # llama-server's `timings` object, if any
    chunk_times: list[float] = field(default_factory=list)  # offsets from t_start of token chunks
    content: str = ""  # the reply's content (a completion's text)
    reasoning: str = ""  # reasoning_content deltas
    tool_calls: list[dict] = field(default_factory=list)  # {"id", "name", "arguments"} by index
    cache_header: str | None = None  # warmslot's x-warmslot-cache response header

    def summary(self) -> dict[str, Any]:
        """The timings and counts, without arrival times or the reply's parts."""
        d = asdict(self)
        for key in ("chunk_times", "t_start", "content", "reasoning", "tool_calls", "cache_header"):
            d.pop(key)
        return d

    def as_dict(self) -> dict[str, Any]:
        """Every field as plain data (the GPU harness's request records are built from it)."""
        return asdict(self)


class _Reply:
    """The generated parts of a stream, gathered chunk by chunk."""

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict] = {}

    def add(self, choice: dict) -> bool:
        """Take one streamed choice (completions or chat); True when it carried generated text."""
        got = []
        if choice.get("text"):
            self.content.append(choice["text"])
            got.append(choice["text"])
        delta = choice.get("delta") or {}
        if delta.get("content"):
            self.content.append(delta["content"])
            got.append(delta["content"])
        if delta.get("reasoning_content"):
            self.reasoning.append(delta["reasoning_content"])
            got.append(delta["reasoning_content"])
        for tc in delta.get("tool_calls") or []:
            call = self.calls.setdefault(tc.get("index", 0), {"id": None, "name": "", "arguments": ""})
            if tc.get("id"):
                call["id"] = tc["id"]
            fn = tc.get("function") or {}
            for key in ("name", "arguments"):
                if fn.get(key):
                    call[key] += fn[key]
                    got.append(fn[key])
        self.pieces += got
        return bool(got)


def stream_request(
    base_url: str,
    path: str,
    body: dict,
    *,
    client: httpx.Client | None = None,
    timeout: float = 600.0,
    deadline_s: float | None = None,
    headers: dict[str, str] | None = None,
    keep_chunk_times: bool = True,
) -> StreamResult:
    """POST `body` with stream=true and time the server-sent events as they arrive.

    Asks for usage in the stream (stream_options.include_usage) so that token counts come from
    the server; if none arrives, completion_tokens falls back to the number of chunks that
    carried text. `timeout` bounds each read; `deadline_s`, if given, bounds the whole request
    (a server's keep-alive pings do not extend it).
    """
    body = {**body, "stream": True}
    body.setdefault("stream_options", {"include_usage": True})
    own = client is None
    client = client or httpx.Client()
    res = StreamResult(ok=False, status=None)
    reply = _Reply()
    t_first = t_last = None
    try:
        res.t_start = t0 = time.perf_counter()
        with client.stream("POST", base_url.rstrip("/") + path, json=body, headers=headers,
                           timeout=httpx.Timeout(timeout, connect=10.0)) as r:
            res.status = r.status_code
            res.cache_header = r.headers.get("x-warmslot-cache")
            if r.status_code != 200:
                r.read()
                res.error = f"HTTP {r.status_code}: {r.text[:ERROR_CHARS]}"
                return res
            for line in r.iter_lines():
                now = time.perf_counter()
                if deadline_s is not None and now - t0 > deadline_s:
                    res.error = f"timed out after {deadline_s:.0f}s"
                    return res
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                try:
                    chunk = json.loads(data)
                except json.JSONDecodeError:
                    continue
                if "error" in chunk and not chunk.get("choices"):
                    res.error = json.dumps(chunk["error"])[:ERROR_CHARS]
                    return res
                got_token = False
                for choice in chunk.get("choices") or []:
                    got_token = reply.add(choice) or got_token
                    if choice.get("finish_reason"):
                        res.finish_reason = choice["finish_reason"]
                if got_token:
                    res.token_chunks += 1
                    if t_first is None:
                        t_first = now
                    t_last = now
                    if keep_chunk_times:
                        res.chunk_times.append(now - t0)
                if chunk.get("usage"):
                    res.usage = chunk["usage"]
                if chunk.get("timings"):
                    res.timings = chunk["timings"]
        t_end = time.perf_counter()
    except httpx.HTTPError as exc:
        res.error = f"{type(exc).__name__}: {exc}"
        return res
    finally:
        if own:
            client.close()
    res.ok = True
    res.text = "".join(reply.pieces)
    res.content = "".join(reply.content)
    res.reasoning = "".join(reply.reasoning)
    res.tool_calls = [reply.calls[i] for i in sorted(reply.calls)]
    res.total_s = t_end - t0
    if t_first is not None:
        res.ttft_s = t_first - t0
        res.decode_s = t_last - t_first
    if res.usage:
        res.prompt_tokens = res.usage.get("prompt_tokens")
        res.completion_tokens = res.usage.get("completion_tokens")
        details = res.usage.get("prompt_tokens_details") or {}
        res.cached_tokens = details.get("cached_tokens")
    if res.completion_tokens is None:
        res.completion_tokens = res.token_chunks
    if res.timings and res.prompt_tokens is None and "prompt_n" in res.timings:  # llama-server's own counts
        res.prompt_tokens = res.timings["prompt_n"] + res.timings.get("cache_n", 0)
    if res.decode_s and res.completion_tokens and res.completion_tokens > 1:
        res.decode_tps = (res.completion_tokens - 1) / res.decode_s
    return res


def get_json(base_url: str, path: str, timeout: float = 10.0) -> Any:
    """GET a JSON endpoint; None when it fails (e.g. an endpoint one server lacks)."""
    try:
        r = httpx.get(base_url.rstrip("/") + path, timeout=timeout)
        if r.status_code == 200:
            return r.json()
    except (httpx.HTTPError, ValueError):
        pass
    return None


def get_text(base_url: str, path: str, timeout: float = 10.0) -> str | None:
    """GET a text endpoint (e.g. /metrics); None when it fails."""
    try:
        r = httpx.get(base_url.rstrip("/") + path, timeout=timeout)
        if r.status_code == 200:
            return r.text
    except httpx.HTTPError:
        pass
    return None
