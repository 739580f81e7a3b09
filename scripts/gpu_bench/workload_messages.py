"""The `messages` workload: a Claude-Code-shaped session (gpu_bench/claude_code.py) replayed
through Anthropic's Messages API, `POST /v1/messages`, streamed as Claude Code streams it.

Each server runs the whole session once per -np of --msg-np (a fresh server each time): the
main agent's turns, two sub-agents' turns in between, then a compaction. Per request: the
agent, the prompt tokens and the cached ones (usage of message_start / message_delta:
`input_tokens` is what the server computed, `cache_read_input_tokens` what it reused; both
servers report them), and the TTFT (request sent -> first content_block_delta). The summary
gives the main agent's TTFT p50 per server and the ratio warmslot / llama-server, and the
computed tokens against the ideal: per agent, the whole prompt on its first request, then
only the tokens past its previous request's prompt (for the compaction, past its first
request's prompt: the history changes in the first tool result, so the ideal also counts the
first assistant turn, some tens of tokens, as new).

With --msg-shapes current (the default) the requests are today's CLI's (claude_code_shapes.py),
a session-title request among them, whose reply is checked against its JSON schema. A request
a server refuses (an HTTP error, or an error event) is recorded with its status and error text
and the session goes on; the summary counts the errors per agent.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import httpx

from scripts import bench_common as bc

from . import LLAMA_SERVER, WARMSLOT
from .claude_code import Session
from .claude_code_shapes import SHAPES, title_matches_schema
from .client import sse_events
from .servers import Run, Served, counters_delta, round_up

ERROR_CHARS = 1500


def add_messages_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--msg-scale", type=float, default=1.0,
                   help="scale of every size of the messages session (1: a ~20K-token main system prompt, "
                        "~6K for each sub-agent, tool results of 300-2000; 0.1 for a CPU run)")
    p.add_argument("--msg-main-turns", type=int, default=10, help="tool_use -> tool_result turns of the main agent")
    p.add_argument("--msg-sub-turns", type=int, default=5, help="requests of each of the two sub-agents")
    p.add_argument("--msg-np", default="1,2", help="-np values, one server run (the whole session) each")
    p.add_argument("--msg-gen-tokens", type=int, default=32, help="max_tokens of each request")
    p.add_argument("--msg-billing", default="version", choices=("version", "cch"),
                   help="what changes in the billing header of every request: cc_version and cch (version), "
                        "or cch only (which llama-server normalizes)")
    p.add_argument("--msg-shapes", default="current", choices=SHAPES,
                   help="current: today's Claude Code requests (a system message after the first user message, "
                        "adaptive thinking, effort, context management, beta headers, a session-title request with "
                        "a JSON-schema format); legacy: the older shapes without them")
    p.add_argument("--msg-ctx-size", type=int, default=0,
                   help="0: -np x the main agent's longest prompt, +30%% (llama-server's slots get ctx/np each)")


def parse_messages_np(a: argparse.Namespace) -> None:
    if isinstance(a.msg_np, str):
        a.msg_np = [int(x) for x in a.msg_np.split(",") if x.strip()]


def stream_messages(url: str, body: dict, *, timeout: float, path: str = "/v1/messages",
                    headers: dict[str, str] | None = None) -> dict[str, Any]:
    """POST /v1/messages (streamed) and time its events. ttft_s: the first content_block_delta
    (else the message_delta, with ttft_fallback); usage from message_start, updated by
    message_delta's fields. text: every delta; reply: the text deltas alone."""
    out: dict[str, Any] = {"ok": False, "status": None, "error": None, "ttft_s": None, "ttft_fallback": False,
                           "message_start_s": None, "total_s": None, "usage": {}, "stop_reason": None,
                           "deltas": 0, "text": "", "reply": ""}
    headers = {"anthropic-version": "2023-06-01", "x-api-key": "bench", "content-type": "application/json",
               **(headers or {})}
    text: list[str] = []
    reply: list[str] = []
    t0 = time.perf_counter()
    try:
        for now, ev in sse_events(url, path, body, headers=headers, timeout=timeout, t0=t0, out=out, error_chars=ERROR_CHARS):
            kind = ev.get("type")
            if kind == "error":
                out["error"] = json.dumps(ev.get("error"))[:ERROR_CHARS]
                return out
            if kind == "message_start":
                out["message_start_s"] = now
                out["usage"].update((ev.get("message") or {}).get("usage") or {})
            elif kind == "content_block_delta":
                out["deltas"] += 1
                if out["ttft_s"] is None:
                    out["ttft_s"] = now
                d = ev.get("delta") or {}
                text.append(d.get("text") or d.get("thinking") or d.get("partial_json") or "")
                if d.get("type") == "text_delta":
                    reply.append(d.get("text") or "")
            elif kind == "message_delta":
                out["stop_reason"] = (ev.get("delta") or {}).get("stop_reason")
                out["usage"].update(ev.get("usage") or {})
                if out["ttft_s"] is None:
                    out["ttft_s"], out["ttft_fallback"] = now, True
            elif kind == "message_stop":
                break
    except httpx.HTTPError as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        return out
    if out["error"]:  # an HTTP error status, or past the timeout
        return out
    out["total_s"] = time.perf_counter() - t0
    out["ok"] = True
    out["text"] = "".join(text)
    out["reply"] = "".join(reply)
    return out


def request_row(r: dict[str, Any]) -> dict[str, Any]:
    """The figures of one request that go into the JSON."""
    u = r.get("usage") or {}
    computed, cached = u.get("input_tokens"), u.get("cache_read_input_tokens")
    prompt = computed + cached if computed is not None and cached is not None else computed
    row = {k: r.get(k) for k in ("ok", "status", "error", "ttft_s", "ttft_fallback", "message_start_s",
                                 "total_s", "stop_reason", "deltas")}
    row.update({"prompt_tokens": prompt, "cached_tokens": cached, "computed_tokens": computed,
                "output_tokens": u.get("output_tokens"), "text_head": (r.get("text") or "")[:40] or None})
    return row


def add_ideal(rows: list[dict]) -> None:
    """ideal_computed of each row: its prompt, less the prompt of the request its `base` names;
    a base the server refused is passed over for its own base (the server never held it)."""
    for row in rows:
        p = row.get("prompt_tokens")
        if p is None:
            continue
        base = row.get("base")
        while base is not None and base < len(rows) and not rows[base].get("ok"):
            base = rows[base].get("base")
        bp = rows[base].get("prompt_tokens") if base is not None and base < len(rows) else None
        row["ideal_computed"] = p if base is None else (max(0, p - bp) if bp is not None else None)


def summarise(rows: list[dict]) -> dict[str, Any]:
    """TTFTs, token totals and, per agent, requests, errors and tokens (title: whether its reply
    matched the schema)."""
    ok = [r for r in rows if r.get("ok")]
    main_later = [r for r in ok if r["agent"] == "main" and not r["compacted"] and r["base"] is not None]

    def total(key: str, sel: list[dict]) -> int | None:
        vals = [r.get(key) for r in sel]
        return None if not sel or any(v is None for v in vals) else int(sum(vals))

    out: dict[str, Any] = {
        "requests": len(rows), "ok": len(ok), "errors": [r.get("error") for r in rows if not r.get("ok")][:5],
        "main_ttft_s_p50": bc.percentile([r["ttft_s"] for r in main_later if r.get("ttft_s") is not None], 50),
        "main_ttft_s_first": next((r["ttft_s"] for r in ok if r["agent"] == "main"), None),
        "sub_ttft_s_p50": bc.percentile([r["ttft_s"] for r in ok
                                         if r["agent"].startswith("sub") and r["base"] is not None
                                         and r.get("ttft_s") is not None], 50),
        "compaction_ttft_s": [r["ttft_s"] for r in ok if r["compacted"]],
        "prompt_tokens_total": total("prompt_tokens", ok),
        "cached_tokens_total": total("cached_tokens", ok),
        "computed_tokens_total": total("computed_tokens", ok),
        "ideal_computed_total": total("ideal_computed", ok),
        "last_main_prompt_tokens": max((r["prompt_tokens"] or 0 for r in ok if r["agent"] == "main"), default=None),
        "per_agent": {},
    }
    if out["computed_tokens_total"] is not None and out["ideal_computed_total"]:
        out["computed_over_ideal"] = round(out["computed_tokens_total"] / out["ideal_computed_total"], 4)
    for agent in dict.fromkeys(r["agent"] for r in rows):
        sel = [r for r in ok if r["agent"] == agent]
        failed = [r for r in rows if r["agent"] == agent and not r.get("ok")]
        out["per_agent"][agent] = {"requests": len(sel) + len(failed), "ok": len(sel), "errors": len(failed),
                                   "statuses": sorted({r.get("status") for r in failed}, key=str),
                                   "first_error": failed[0].get("error") if failed else None,
                                   "computed": total("computed_tokens", sel), "ideal": total("ideal_computed", sel)}
    out["errors_by_agent"] = {agent: e["errors"] for agent, e in out["per_agent"].items()}
    titles = [r for r in rows if r["agent"] == "title"]
    if titles:
        out["title_json_ok"] = titles[0].get("title_json_ok")
        out["title_reply"] = titles[0].get("reply_head")
    return out


def messages_ctx(a: argparse.Namespace, session: Session, np_: int) -> int:
    if a.msg_ctx_size:
        return a.msg_ctx_size
    longest = session.size_estimate("main", a.msg_main_turns + 1) + a.msg_gen_tokens
    return round_up(int(longest * 1.3) * np_, 1024)


def run_session(run: Run, srv: Served, session: Session, label: str) -> list[dict]:
    """Every request of the session in order; one the server refuses is recorded and the
    session goes on (the next requests of its agent are still sent)."""
    a = run.a
    rows: list[dict] = []
    for i, step in enumerate(session.schedule(a.msg_main_turns, a.msg_sub_turns)):
        if run.budget.spent():
            rows.append({"index": i, "agent": step.agent, "ok": False, "error": "time budget spent",
                         "compacted": step.compacted, "base": step.base})
            break
        r = stream_messages(srv.url, session.body(step, i), timeout=run.timeout(), path=session.path(),
                            headers=session.headers(step))
        row = {"index": i, "agent": step.agent, "tool_results": step.n_results, "compacted": step.compacted,
               "base": step.base, **request_row(r)}
        if step.agent == "title":
            row["title_json_ok"] = title_matches_schema(r.get("reply")) if r.get("ok") else None
            row["reply_head"] = (r.get("reply") or "")[:120]
        rows.append(row)
        run.log(f"  {srv.server:12s} {label} #{i:2d} {step.agent:5s}{' compacted' if step.compacted else ''} "
                f"results {step.n_results}: HTTP {row['status']} prompt {row['prompt_tokens']} cached "
                f"{row['cached_tokens']} TTFT {(row['ttft_s'] or 0) * 1000:.0f} ms"
                + (f" title JSON ok: {row['title_json_ok']}" if step.agent == "title" else "")
                + (f" ERROR {row['error'][:200]}" if row.get("error") else ""))
    add_ideal(rows)
    return rows


def workload_messages(run: Run) -> dict[str, Any]:
    a = run.a
    parse_messages_np(a)
    session = Session(run.texts, scale=a.msg_scale, gen_tokens=a.msg_gen_tokens, billing=a.msg_billing,
                      session_id="0b7c2d4e-5f60-4a1b-8c9d-0e1f2a3b4c5d", shapes=a.msg_shapes)
    steps = session.schedule(a.msg_main_turns, a.msg_sub_turns)
    out: dict[str, Any] = {"settings": {
        "scale": a.msg_scale, "main_turns": a.msg_main_turns, "sub_turns": a.msg_sub_turns, "np": a.msg_np,
        "gen_tokens": a.msg_gen_tokens, "billing_varies": a.msg_billing, "shapes": a.msg_shapes,
        "schedule": [f"{s.agent}{'*' if s.compacted else ''}:{s.n_results}" for s in steps]}, "servers": {}}
    for server in a.servers:
        res: dict[str, Any] = {"runs": {}}
        out["servers"][server] = res
        for np_ in a.msg_np:
            label = f"np{np_}"
            entry: dict[str, Any] = {}
            res["runs"][label] = entry
            if run.budget.spent():
                entry["skipped"] = "time budget spent"
                continue
            with Served(run, server, np_, messages_ctx(a, session, np_), f"messages-{label}") as srv:
                entry["server"] = srv.info
                if not srv.ok:
                    continue
                run.log(f"messages session on {server}, -np {np_}")
                before = srv.state_counters()
                t0 = time.perf_counter()
                entry["requests"] = run_session(run, srv, session, label)
                entry["wall_s"] = round(time.perf_counter() - t0, 2)
                entry["counters"] = counters_delta(before, srv.state_counters())
                entry["summary"] = summarise(entry["requests"])
            run.save()
    out["comparison"] = compare(out)
    return out


def compare(out: dict[str, Any]) -> dict[str, Any]:
    """Per -np: the main agent's TTFT p50 of each server and warmslot / llama-server, and each
    server's errors per agent."""
    cmp: dict[str, Any] = {}
    servers = out.get("servers") or {}
    for label in (servers.get(WARMSLOT) or servers.get(LLAMA_SERVER) or {}).get("runs", {}):
        s = {srv: ((servers.get(srv) or {}).get("runs", {}).get(label) or {}).get("summary") or {}
             for srv in (WARMSLOT, LLAMA_SERVER)}
        ws, ls = s[WARMSLOT].get("main_ttft_s_p50"), s[LLAMA_SERVER].get("main_ttft_s_p50")
        cmp[label] = {"main_ttft_s_p50": {WARMSLOT: ws, LLAMA_SERVER: ls},
                      "ttft_ratio_warmslot_over_llama_server": round(ws / ls, 4) if ws and ls else None,
                      "warmslot_computed": s[WARMSLOT].get("computed_tokens_total"),
                      "warmslot_ideal": s[WARMSLOT].get("ideal_computed_total"),
                      "warmslot_computed_over_ideal": s[WARMSLOT].get("computed_over_ideal"),
                      "llama_server_computed": s[LLAMA_SERVER].get("computed_tokens_total"),
                      "errors_by_agent": {srv: s[srv].get("errors_by_agent") for srv in (WARMSLOT, LLAMA_SERVER)},
                      "title_json_ok": {srv: s[srv].get("title_json_ok") for srv in (WARMSLOT, LLAMA_SERVER)}}
    return cmp
