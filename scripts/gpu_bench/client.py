"""HTTP to either server beyond the streamed request itself (scripts/bench_client.py):
tokenization, the rendered prompt, and the per-request record that goes into the result JSON."""

from __future__ import annotations

import argparse
import hashlib
import json
import threading
import time
from typing import Any, Callable, Iterator

import httpx

from scripts.bench_client import stream_request

from . import WARMSLOT


def tokenize_text(url: str, text: str, add_special: bool = False, timeout: float = 60.0) -> list[int] | None:
    """Token ids of `text` (both servers serve POST /tokenize {"content"})."""
    try:
        r = httpx.post(url + "/tokenize", json={"content": text, "add_special": add_special, "parse_special": True},
                       timeout=timeout)
        if r.status_code == 200:
            toks = r.json().get("tokens")
            if isinstance(toks, list):
                return [t["id"] if isinstance(t, dict) else t for t in toks]
    except (httpx.HTTPError, ValueError):
        pass
    return None


def render_tokens(server: str, url: str, messages: list[dict], tools: list[dict] | None,
                  template_kwargs: dict | None, timeout: float = 120.0) -> list[int] | None:
    """The token ids the server evaluates for a chat request (for the ideal-reuse count)."""
    try:
        if server == WARMSLOT:
            body: dict[str, Any] = {"messages": messages}
            if tools:
                body["tools"] = tools
            r = httpx.post(url + "/tokenize", json=body, timeout=timeout)
            if r.status_code == 200:
                return r.json().get("tokens")
            return None
        body = {"messages": messages}
        if tools:
            body["tools"] = tools
        if template_kwargs:
            body["chat_template_kwargs"] = template_kwargs
        r = httpx.post(url + "/apply-template", json=body, timeout=timeout)
        if r.status_code != 200:
            return None
        return tokenize_text(url, r.json()["prompt"], add_special=True, timeout=timeout)
    except (httpx.HTTPError, ValueError, KeyError):
        return None


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def stream(url: str, path: str, body: dict, *, timeout: float, keep_chunk_times: bool = False) -> dict[str, Any]:
    """One streamed request through the benchmarks' client, as the plain record the workloads
    keep. The whole request is bounded by `timeout` seconds (read pings do not extend it)."""
    return stream_request(url, path, body, timeout=timeout, deadline_s=timeout,
                          keep_chunk_times=keep_chunk_times).as_dict()


def request_record(r: dict[str, Any]) -> dict[str, Any]:
    """The figures of one request that go into the JSON (no texts beyond a short head)."""
    t = r.get("timings") or {}
    out = {k: r.get(k) for k in ("ok", "status", "error", "ttft_s", "total_s", "decode_s", "decode_tps",
                                 "prompt_tokens", "cached_tokens", "completion_tokens", "token_chunks",
                                 "finish_reason", "cache_header")}
    out["computed_tokens"] = computed_tokens(r)
    out["server_cache_n"] = t.get("cache_n")
    out["server_prompt_n"] = t.get("prompt_n")
    out["server_prompt_ms"] = t.get("prompt_ms")
    out["server_prompt_per_second"] = t.get("prompt_per_second")
    out["server_predicted_per_second"] = t.get("predicted_per_second")
    gen = (r.get("reasoning") or "") + (r.get("content") or "")
    out["text_sha1"] = hashlib.sha1(gen.encode()).hexdigest()[:12] if r.get("ok") else None
    out["text_head"] = gen[:60] if r.get("ok") else None
    out["tool_calls"] = [c.get("name") for c in r.get("tool_calls") or []] or None
    return out


def computed_tokens(r: dict[str, Any]) -> int | None:
    """Prompt tokens the server evaluated: llama-server's timings.prompt_n, else prompt - cached."""
    t = r.get("timings") or {}
    if t.get("prompt_n") is not None:
        return int(t["prompt_n"])
    if r.get("prompt_tokens") is not None and r.get("cached_tokens") is not None:
        return int(r["prompt_tokens"]) - int(r["cached_tokens"])
    return None


def sampling_body(a: argparse.Namespace, max_tokens: int) -> dict[str, Any]:
    # Greedy on both servers; top_k=1 keeps llama-server's sampler chain from sorting the vocabulary.
    body: dict[str, Any] = {"model": "bench", "max_tokens": max_tokens, "temperature": 0.0, "top_k": 1,
                            "top_p": 1.0, "min_p": 0.0, "seed": 0, "ignore_eos": True}
    if a.template_kwargs:
        body["chat_template_kwargs"] = a.template_kwargs
    return body


def at_once(n: int, work: Callable[[int, float], None], join_s: float) -> None:
    """work(k, t0) for k in range(n), each on a thread of its own, all released together;
    t0 is time.perf_counter() at the release. Waits up to join_s for each thread."""
    barrier = threading.Barrier(n + 1)
    t0 = [0.0]

    def go(k: int) -> None:
        barrier.wait()
        work(k, t0[0])

    threads = [threading.Thread(target=go, args=(k,), daemon=True) for k in range(n)]
    for t in threads:
        t.start()
    t0[0] = time.perf_counter()
    barrier.wait()
    for t in threads:
        t.join(join_s)


def sse_events(url: str, path: str, body: dict, *, headers: dict[str, str], timeout: float, t0: float,
               out: dict[str, Any], error_chars: int = 1500) -> Iterator[tuple[float, dict]]:
    """POST `body` with `stream: true` and yield (seconds since t0, event) for each JSON
    `data:` line. Sets out["status"]; sets out["error"] and stops on a status other than 200
    or once the stream runs past `timeout`. httpx errors reach the caller."""
    with httpx.stream("POST", url.rstrip("/") + path, json={**body, "stream": True}, headers=headers,
                      timeout=httpx.Timeout(timeout, connect=10.0)) as r:
        out["status"] = r.status_code
        if r.status_code != 200:
            r.read()
            out["error"] = f"HTTP {r.status_code}: {r.text[:error_chars]}"
            return
        for line in r.iter_lines():
            now = time.perf_counter() - t0
            if now > timeout:
                out["error"] = f"timed out after {timeout:.0f}s"
                return
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            try:
                yield now, json.loads(line[5:].strip())
            except json.JSONDecodeError:
                continue
