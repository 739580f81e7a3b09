"""The `agent` workload: one agent session replayed turn by turn on -np 1, in echo,
rerender and nocache modes, with the ideal computed-token count of every turn."""

from __future__ import annotations

import time
from typing import Any

from scripts import bench_common as bc

from . import LLAMA_SERVER, WARMSLOT
from .agent import Agent, tool_sizes
from .client import common_prefix, render_tokens, request_record, sampling_body, stream, tokenize_text
from .servers import Run, Served

AGENT_MODES = ("echo", "rerender", "nocache")


def summarise_turns(turns: list[dict], mode: str, first_k: int | None = None) -> dict[str, Any]:
    ok = [t for t in turns if t.get("ok")]
    later = [t for t in ok if t["turn"] >= 2]

    def total(key: str, rows: list[dict]) -> int | None:
        vals = [t.get(key) for t in rows]
        return None if not rows or any(v is None for v in vals) else int(sum(vals))

    out = {
        "mode": mode,
        "turns": len(turns),
        "turns_ok": len(ok),
        "errors": [t.get("error") for t in turns if not t.get("ok")],
        "prompt_tokens_total": total("prompt_tokens", ok),
        "cached_tokens_total": total("cached_tokens", ok),
        "computed_tokens_total": total("computed_tokens", ok),
        "ideal_computed_total": total("ideal_computed", ok),
        "completion_tokens_total": total("completion_tokens", ok),
        "last_prompt_tokens": ok[-1]["prompt_tokens"] if ok else None,
        "wall_s": sum(t["total_s"] for t in ok) if ok else None,
        "ttft_s_p50_turn2plus": bc.percentile([t["ttft_s"] for t in later], 50),
        "ttft_s_p95_turn2plus": bc.percentile([t["ttft_s"] for t in later], 95),
        "ttft_s_turn1": ok[0]["ttft_s"] if ok and ok[0]["turn"] == 1 else None,
        "decode_tps_p50": bc.percentile([t["decode_tps"] for t in ok], 50),
        "server_prompt_ms_total": sum(t["server_prompt_ms"] for t in ok if t.get("server_prompt_ms") is not None)
        if any(t.get("server_prompt_ms") is not None for t in ok) else None,
    }
    if out["computed_tokens_total"] and out["ideal_computed_total"]:
        out["computed_over_ideal"] = out["computed_tokens_total"] / out["ideal_computed_total"]
    if first_k:
        head = [t for t in ok if t["turn"] <= first_k]
        out["first_k"] = first_k
        out["wall_s_first_k"] = sum(t["total_s"] for t in head) if head else None
        out["computed_tokens_first_k"] = total("computed_tokens", head)
    return out


def run_agent_mode(run: Run, srv: Served, mode: str, session: str, turns: int) -> dict[str, Any]:
    """One replay; returns {"turns": [...], "summary": {...}} (errors recorded per turn)."""
    a = run.a
    lo, hi = a.tool_tokens
    agent = Agent(run.texts, session=session, system_tokens=a.system_tokens, n_tools=a.n_tools,
                  tools_in=a.tools_in, tool_lo=lo, tool_hi=hi, turns=a.turns, task_seed="agent")
    tools = agent.request_tools()
    messages = agent.first_messages()
    rows: list[dict] = []
    prev_tokens: list[int] | None = None
    prev_gen: list[int] = []
    prev_prompt = prev_completion = None
    t_mode = time.perf_counter()
    stop_reason = None
    for turn in range(1, turns + 1):
        if run.budget.spent():
            stop_reason = "time budget spent"
            break
        body = {**sampling_body(a, a.gen_tokens), "messages": messages}
        if tools:
            body["tools"] = tools
        if mode == "nocache":
            body["cache_prompt"] = False
        r = stream(srv.url, "/v1/chat/completions", body, timeout=run.timeout())
        row = {"turn": turn, "messages": len(messages), **request_record(r)}
        # ideal: the tokens that are really new this turn (see the report for the definition)
        if a.ideal and mode != "nocache" and r.get("ok"):
            toks = render_tokens(srv.server, srv.url, messages, tools, a.template_kwargs)
            if toks is not None:
                row["rendered_tokens"] = len(toks)
                if prev_tokens is None:
                    reuse = 0
                else:
                    reuse = common_prefix(toks, prev_tokens + prev_gen)
                row["ideal_reusable"] = reuse
                row["ideal_computed"] = len(toks) - reuse
                prev_tokens = toks
                gen_text = (r.get("reasoning") or "") + (r.get("content") or "")
                prev_gen = (tokenize_text(srv.url, gen_text) or []) if mode == "echo" and gen_text else []
        if row.get("ideal_computed") is None and r.get("ok") and r.get("prompt_tokens") is not None:
            # arithmetic fallback: everything past the previous prompt (+ its completion when echoed)
            p = r["prompt_tokens"]
            if prev_prompt is None:
                row["ideal_computed_approx"] = p
            else:
                seen = prev_prompt + ((prev_completion or 0) if mode == "echo" else 0)
                row["ideal_computed_approx"] = max(0, p - min(seen, p))
        rows.append(row)
        c = row.get("computed_tokens")
        run.log(f"  {srv.server:12s} {mode:8s} turn {turn:2d}: prompt {row['prompt_tokens']} cached "
                f"{row['cached_tokens']} computed {c} ideal {row.get('ideal_computed')} TTFT "
                f"{(row['ttft_s'] or 0) * 1000:.0f} ms decode {row['decode_tps'] or 0:.1f} tok/s"
                + (f" ERROR {row['error'][:200]}" if row.get("error") else ""))
        if not r.get("ok"):
            stop_reason = "request failed"
            break
        prev_prompt, prev_completion = r.get("prompt_tokens"), r.get("completion_tokens")
        if turn == turns:
            break
        # the assistant turn, then the tool result
        msg, call_id = agent.echoed_reply(turn, r) if mode == "echo" else agent.recorded_reply(turn)
        result, _size = agent.tool_result(turn - 1)
        messages = messages + [msg, {"role": "tool", "tool_call_id": call_id, "content": result}]
        if prev_prompt is not None and prev_prompt + _size + 2 * a.gen_tokens + 256 > srv.info["ctx"]:
            stop_reason = "the next prompt would not fit the context"
            break
    summary = summarise_turns(rows, mode, first_k=a.nocache_turns if mode != "nocache" else None)
    summary["measured_wall_s"] = time.perf_counter() - t_mode
    summary["stopped"] = stop_reason
    return {"turns": rows, "summary": summary}


def probe_cache_prompt(run: Run, srv: Served) -> dict[str, Any]:
    """Does the server honour `cache_prompt: false`? Sends the same short prompt twice."""
    prompt = run.texts.text("prose", "cache-prompt-probe", 200)
    body = {**sampling_body(run.a, 1), "prompt": prompt}
    first = stream(srv.url, "/v1/completions", body, timeout=run.timeout())
    second = stream(srv.url, "/v1/completions", {**body, "cache_prompt": False}, timeout=run.timeout())
    cached = second.get("cached_tokens")
    t = second.get("timings") or {}
    if t.get("cache_n") is not None:
        cached = t["cache_n"]
    honoured = bool(first.get("ok") and second.get("ok") and cached == 0)
    return {"honoured": honoured, "cached_tokens_with_cache_prompt_false": cached,
            "first": request_record(first), "second": request_record(second)}


def workload_agent(run: Run) -> dict[str, Any]:
    a = run.a
    out: dict[str, Any] = {"settings": {
        "system_tokens": a.system_tokens, "turns": a.turns, "gen_tokens": a.gen_tokens, "tool_tokens": a.tool_tokens,
        "n_tools": a.n_tools, "tools_in": a.tools_in, "modes": a.agent_modes, "nocache_turns": a.nocache_turns,
        "ctx": a.ctx_size, "np": 1,
        "tool_result_sizes": tool_sizes(a.turns, *a.tool_tokens)}, "servers": {}}
    for server in a.servers:
        res: dict[str, Any] = {"modes": {}}
        out["servers"][server] = res
        with Served(run, server, 1, a.ctx_size, "agent") as srv:
            res["server"] = srv.info
            if not srv.ok:
                continue
            nocache_mode = "nocache" in a.agent_modes
            for mode in a.agent_modes:
                if mode == "nocache":
                    continue
                run.log(f"agent replay, {mode}, on {server}")
                res["modes"][mode] = run_agent_mode(run, srv, mode, mode, a.turns)
                run.save()
            if nocache_mode:
                probe = probe_cache_prompt(run, srv)
                res["cache_prompt_probe"] = probe
                if server == LLAMA_SERVER or probe["honoured"]:
                    if server == WARMSLOT:
                        res["nocache_note"] = "run on a separate warmslot server with --cache-ram 0"
                    else:
                        run.log(f"agent replay, nocache ({a.nocache_turns} turns), on {server}")
                        res["modes"]["nocache"] = run_agent_mode(run, srv, "nocache", "nocache", a.nocache_turns)
                else:
                    res["nocache_note"] = ("warmslot ignores cache_prompt=false (a repeated prompt still came from "
                                           "the cache): its no-cache baseline is not run; compare with "
                                           "llama-server's")
                    run.log(res["nocache_note"])
        if server == WARMSLOT and "nocache" in a.agent_modes and res.get("cache_prompt_probe", {}).get("honoured"):
            with Served(run, server, 1, a.ctx_size, "agent-nocache", ["--cache-ram", "0"]) as srv:
                res["server_nocache"] = srv.info
                if srv.ok:
                    res["modes"]["nocache"] = run_agent_mode(run, srv, "nocache", "nocache", a.nocache_turns)
        run.save()
    return out
