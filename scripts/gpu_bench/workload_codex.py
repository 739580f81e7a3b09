"""The `codex` workload: a Codex-shaped session (gpu_bench/codex.py) through the Responses
API, `POST /v1/responses`, streamed, each request resending the whole history as the Codex CLI
does (`store: false`).

Each server runs the session once, on -np --codex-np (a fresh server): --codex-turns requests,
each the previous request's input, the output items it got back and the calls' outputs. Per
request: the HTTP status and error text (a refused request is recorded and the session goes
on), the TTFT (request sent -> the first `response.output_text.delta` or
`response.function_call_arguments.delta`; else the first reasoning delta, with
ttft_fallback), usage (`input_tokens`, `input_tokens_details.cached_tokens`), the output items'
types and whether reasoning came back with `encrypted_content`. The summary: TTFT p50 of the
requests after the first, the ratio warmslot / llama-server, the computed tokens (input -
cached) against the ideal (the whole prompt first, then what is past the previous prompt: a
server that puts the previous turn back exactly as generated can compute less), errors.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import httpx

from scripts import bench_common as bc

from . import LLAMA_SERVER, WARMSLOT
from .codex import TOOL_MODES, CodexSession
from .client import sse_events
from .servers import Run, Served, counters_delta, round_up

ERROR_CHARS = 1500
ANSWER_DELTAS = ("response.output_text.delta", "response.function_call_arguments.delta")
REASONING_DELTAS = ("response.reasoning_text.delta", "response.reasoning_summary_text.delta")


def add_codex_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--codex-scale", type=float, default=1.0,
                   help="scale of every size of the codex session (1: ~10K tokens of developer messages, tool "
                        "results of 1K-4K; 0.05 for a CPU run)")
    p.add_argument("--codex-turns", type=int, default=8, help="requests of the codex session")
    p.add_argument("--codex-np", type=int, default=1, help="-np of the codex run")
    p.add_argument("--codex-gen-tokens", type=int, default=32, help="max_output_tokens of each request")
    p.add_argument("--codex-tools", default="codex", choices=TOOL_MODES,
                   help="codex: the CLI's tools (functions, the multi_agent_v1 namespace, hosted web_search); "
                        "functions: the namespace's functions as plain ones and no hosted tool")
    p.add_argument("--codex-ctx-size", type=int, default=0, help="0: -np x the last prompt, +30%%")


def stream_responses(url: str, body: dict, *, timeout: float) -> dict[str, Any]:
    """POST /v1/responses (streamed) and time its events; the output items from
    `response.completed` (else the `response.output_item.done` events)."""
    out: dict[str, Any] = {"ok": False, "status": None, "error": None, "ttft_s": None, "ttft_fallback": False,
                           "first_delta_s": None, "total_s": None, "usage": {}, "output": [], "events": 0,
                           "response_status": None, "timings": None, "warmslot": None}
    done_items: list[dict] = []
    t0 = time.perf_counter()
    try:
        for now, ev in sse_events(url, "/v1/responses", body, timeout=timeout, t0=t0, out=out, error_chars=ERROR_CHARS,
                                  headers={"authorization": "Bearer bench", "content-type": "application/json"}):
            out["events"] += 1
            kind = ev.get("type")
            if ev.get("timings"):
                out["timings"] = ev["timings"]
            if kind in ANSWER_DELTAS or kind in REASONING_DELTAS:
                if out["first_delta_s"] is None:
                    out["first_delta_s"] = now
                if kind in ANSWER_DELTAS and out["ttft_s"] is None:
                    out["ttft_s"] = now
            elif kind == "response.output_item.done":
                done_items.append(ev.get("item") or {})
            elif kind in ("error", "response.failed"):
                err = ev.get("error") or (ev.get("response") or {}).get("error") or ev
                out["error"] = out["error"] or json.dumps(err)[:ERROR_CHARS]
            elif kind in ("response.completed", "response.incomplete"):
                resp = ev.get("response") or {}
                out["usage"] = resp.get("usage") or {}
                out["output"] = resp.get("output") or done_items
                out["response_status"] = resp.get("status")
                out["warmslot"] = resp.get("warmslot")
                break
    except httpx.HTTPError as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        return out
    if out["error"]:
        return out
    out["total_s"] = time.perf_counter() - t0
    if out["ttft_s"] is None:
        out["ttft_s"], out["ttft_fallback"] = out["first_delta_s"] or out["total_s"], True
    out["output"] = out["output"] or done_items
    out["ok"] = True
    return out


def request_row(r: dict[str, Any]) -> dict[str, Any]:
    """The figures of one request that go into the JSON."""
    u = r.get("usage") or {}
    prompt = u.get("input_tokens")
    cached = (u.get("input_tokens_details") or {}).get("cached_tokens")
    t = r.get("timings") or {}
    computed = t.get("prompt_n") if t.get("prompt_n") is not None else (
        prompt - cached if prompt is not None and cached is not None else None)
    output = r.get("output") or []
    row = {k: r.get(k) for k in ("ok", "status", "error", "ttft_s", "ttft_fallback", "first_delta_s", "total_s",
                                 "response_status", "events")}
    row.update({
        "prompt_tokens": prompt, "cached_tokens": cached, "computed_tokens": computed,
        "output_tokens": u.get("output_tokens"),
        "server_cache_n": t.get("cache_n"), "server_prompt_n": t.get("prompt_n"),
        "output_types": [it.get("type") for it in output],
        "encrypted_content": any(it.get("type") == "reasoning" and it.get("encrypted_content") for it in output),
        "calls": [it.get("name") for it in output if it.get("type") == "function_call"] or None,
    })
    extra = json.dumps(r["warmslot"]) if r.get("warmslot") else None  # warmslot's own notes on the response
    if extra:
        row["warmslot"] = r["warmslot"] if len(extra) <= 2000 else extra[:2000]
    return row


def add_ideal(rows: list[dict]) -> None:
    """ideal_computed: the whole prompt for the first answered request, then the tokens past the
    previous answered request's prompt (a refused request was never held by the server)."""
    prev = None
    for row in rows:
        p = row.get("prompt_tokens")
        if not row.get("ok") or p is None:
            continue
        row["ideal_computed"] = p if prev is None else max(0, p - prev)
        prev = p


def summarise(rows: list[dict]) -> dict[str, Any]:
    ok = [r for r in rows if r.get("ok")]
    failed = [r for r in rows if not r.get("ok")]
    later = [r for r in ok if r.get("turn", 0) > 0]

    def total(key: str) -> int | None:
        vals = [r.get(key) for r in ok]
        return None if not ok or any(v is None for v in vals) else int(sum(vals))

    out: dict[str, Any] = {
        "requests": len(rows), "ok": len(ok), "errors": len(failed),
        "statuses": sorted({r.get("status") for r in failed}, key=str),
        "first_errors": [r.get("error") for r in failed][:3],
        "ttft_s_first": ok[0]["ttft_s"] if ok and ok[0].get("turn") == 0 else None,
        "ttft_s_p50": bc.percentile([r.get("ttft_s") for r in later], 50),
        "ttft_fallbacks": sum(1 for r in ok if r.get("ttft_fallback")),
        "prompt_tokens_total": total("prompt_tokens"), "cached_tokens_total": total("cached_tokens"),
        "computed_tokens_total": total("computed_tokens"), "ideal_computed_total": total("ideal_computed"),
        "last_prompt_tokens": max((r.get("prompt_tokens") or 0 for r in ok), default=None),
        "encrypted_content_returned": sum(1 for r in ok if r.get("encrypted_content")),
        "calls_returned": sum(len(r.get("calls") or []) for r in ok),
    }
    if out["computed_tokens_total"] is not None and out["ideal_computed_total"]:
        out["computed_over_ideal"] = round(out["computed_tokens_total"] / out["ideal_computed_total"], 4)
    return out


def run_session(run: Run, srv: Served, session: CodexSession) -> list[dict]:
    """The session's requests in order, each the whole history so far."""
    a = run.a
    history = session.head()
    rows: list[dict] = []
    for turn in range(a.codex_turns):
        if run.budget.spent():
            rows.append({"turn": turn, "ok": False, "error": "time budget spent"})
            break
        r = stream_responses(srv.url, session.body(history, turn), timeout=run.timeout())
        row = {"turn": turn, "input_items": len(history), **request_row(r)}
        rows.append(row)
        run.log(f"  {srv.server:12s} codex #{turn:2d}: HTTP {row['status']} prompt {row['prompt_tokens']} cached "
                f"{row['cached_tokens']} TTFT {(row['ttft_s'] or 0) * 1000:.0f} ms"
                f"{' (fallback)' if row.get('ttft_fallback') else ''} items {row['output_types']}"
                + (f" ERROR {row['error'][:200]}" if row.get("error") else ""))
        history = history + session.turn_items(r.get("output") if r.get("ok") else None, turn)
    add_ideal(rows)
    return rows


def codex_ctx(a: argparse.Namespace, session: CodexSession) -> int:
    if a.codex_ctx_size:
        return a.codex_ctx_size
    return round_up(int(session.size_estimate(a.codex_turns) * 1.3) * a.codex_np, 1024)


def workload_codex(run: Run) -> dict[str, Any]:
    a = run.a
    session = CodexSession(run.texts, scale=a.codex_scale, gen_tokens=a.codex_gen_tokens, tools_mode=a.codex_tools)
    out: dict[str, Any] = {"settings": {
        "scale": a.codex_scale, "turns": a.codex_turns, "np": a.codex_np, "gen_tokens": a.codex_gen_tokens,
        "tools": a.codex_tools, "ctx": codex_ctx(a, session), "prompt_cache_key": session.session_id}, "servers": {}}
    for server in a.servers:
        entry: dict[str, Any] = {}
        out["servers"][server] = entry
        if run.budget.spent():
            entry["skipped"] = "time budget spent"
            continue
        with Served(run, server, a.codex_np, codex_ctx(a, session), "codex") as srv:
            entry["server"] = srv.info
            if not srv.ok:
                continue
            run.log(f"codex session on {server}, -np {a.codex_np}")
            before = srv.state_counters()
            t0 = time.perf_counter()
            entry["requests"] = run_session(run, srv, session)
            entry["wall_s"] = round(time.perf_counter() - t0, 2)
            entry["counters"] = counters_delta(before, srv.state_counters())
            entry["summary"] = summarise(entry["requests"])
        run.save()
    out["comparison"] = compare(out)
    return out


def compare(out: dict[str, Any]) -> dict[str, Any]:
    """TTFT p50 of each server and warmslot / llama-server; computed against ideal; errors."""
    s = {srv: ((out.get("servers") or {}).get(srv) or {}).get("summary") or {} for srv in (WARMSLOT, LLAMA_SERVER)}
    ws, ls = s[WARMSLOT].get("ttft_s_p50"), s[LLAMA_SERVER].get("ttft_s_p50")
    return {"ttft_s_p50": {WARMSLOT: ws, LLAMA_SERVER: ls},
            "ttft_ratio_warmslot_over_llama_server": round(ws / ls, 4) if ws and ls else None,
            "computed": {srv: s[srv].get("computed_tokens_total") for srv in s},
            "ideal": {srv: s[srv].get("ideal_computed_total") for srv in s},
            "errors": {srv: s[srv].get("errors") for srv in s}}
