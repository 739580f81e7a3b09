"""HTTP to either server: streamed OpenAI requests timed on the client, tokenization, and
the per-request record that goes into the result JSON."""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from typing import Any

import httpx

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
    """One streamed request, timed on the client.

    ttft_s: request sent -> first chunk carrying generated text, reasoning or a tool-call delta.
    decode_tps: (completion_tokens - 1) / (last such chunk - first). The whole request is bounded by
    `timeout` seconds (read pings do not extend it).
    """
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    rec: dict[str, Any] = {"ok": False, "status": None, "error": None, "ttft_s": None, "total_s": None,
                           "decode_s": None, "decode_tps": None, "token_chunks": 0, "prompt_tokens": None,
                           "cached_tokens": None, "completion_tokens": None, "finish_reason": None}
    content, reasoning, text = [], [], []
    calls: dict[int, dict] = {}
    usage = timings = None
    chunk_times: list[float] = []
    t_first = t_last = None
    t0 = time.perf_counter()
    rec["t_start"] = t0
    try:
        with httpx.Client(timeout=httpx.Timeout(timeout, connect=10.0)) as client, \
                client.stream("POST", url + path, json=body) as r:
            rec["status"] = r.status_code
            rec["cache_header"] = r.headers.get("x-warmslot-cache")
            if r.status_code != 200:
                r.read()
                rec["error"] = f"HTTP {r.status_code}: {r.text[:1500]}"
                return rec
            for line in r.iter_lines():
                now = time.perf_counter()
                if now - t0 > timeout:
                    rec["error"] = f"timed out after {timeout:.0f}s"
                    return rec
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
                    rec["error"] = json.dumps(chunk["error"])[:1500]
                    return rec
                got = False
                for choice in chunk.get("choices") or []:
                    if choice.get("text"):
                        text.append(choice["text"])
                        got = True
                    delta = choice.get("delta") or {}
                    if delta.get("content"):
                        content.append(delta["content"])
                        got = True
                    if delta.get("reasoning_content"):
                        reasoning.append(delta["reasoning_content"])
                        got = True
                    for tc in delta.get("tool_calls") or []:
                        slot = calls.setdefault(tc.get("index", 0), {"id": None, "name": "", "arguments": ""})
                        if tc.get("id"):
                            slot["id"] = tc["id"]
                        fn = tc.get("function") or {}
                        if fn.get("name"):
                            slot["name"] += fn["name"]
                            got = True
                        if fn.get("arguments"):
                            slot["arguments"] += fn["arguments"]
                            got = True
                    if choice.get("finish_reason"):
                        rec["finish_reason"] = choice["finish_reason"]
                if got:
                    rec["token_chunks"] += 1
                    if t_first is None:
                        t_first = now
                    t_last = now
                    if keep_chunk_times:
                        chunk_times.append(now - t0)
                if chunk.get("usage"):
                    usage = chunk["usage"]
                if chunk.get("timings"):
                    timings = chunk["timings"]
        t_end = time.perf_counter()
    except httpx.HTTPError as exc:
        rec["error"] = f"{type(exc).__name__}: {exc}"
        return rec
    rec["ok"] = True
    rec["total_s"] = t_end - t0
    if t_first is not None:
        rec["ttft_s"] = t_first - t0
        rec["decode_s"] = t_last - t_first
    rec["content"] = "".join(content) if not text else "".join(text)
    rec["reasoning"] = "".join(reasoning)
    rec["tool_calls"] = [calls[i] for i in sorted(calls)]
    rec["usage"] = usage
    rec["timings"] = timings
    if usage:
        rec["prompt_tokens"] = usage.get("prompt_tokens")
        rec["completion_tokens"] = usage.get("completion_tokens")
        rec["cached_tokens"] = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if rec["completion_tokens"] is None:
        rec["completion_tokens"] = rec["token_chunks"]
    if timings and rec["prompt_tokens"] is None and "prompt_n" in timings:
        rec["prompt_tokens"] = timings["prompt_n"] + timings.get("cache_n", 0)
    if rec["decode_s"] and rec["completion_tokens"] and rec["completion_tokens"] > 1:
        rec["decode_tps"] = (rec["completion_tokens"] - 1) / rec["decode_s"]
    if keep_chunk_times:
        rec["chunk_times"] = chunk_times
    return rec


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
