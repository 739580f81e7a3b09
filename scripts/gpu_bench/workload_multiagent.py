"""The `multiagent` workload: more agents than slots, all running their loops at once.

--ma-agents agents share one system prompt and --ma-tools tool schemas (about
--ma-system-tokens in all) and each has its own task. Every agent runs --ma-turns requests
back to back: the conversation so far, a streamed reply of at most --ma-gen-tokens, which is
echoed back as the assistant message (as agents do), then a tool result of --ma-tool-tokens.
With fewer slots (-np --ma-np) than agents, a server either keeps each agent's state somewhere
or computes its prompt again; the computed prompt tokens and the state copies tell which.
"""

from __future__ import annotations

from typing import Any

from scripts import bench_common as bc

from .agent import Agent
from .client import at_once, request_record, sampling_body, stream
from .servers import Run, Served, counters_delta, round_up

# Tokens an agent's prompt holds beyond the system prompt and its turns: the task, the
# template's role markers, and the tool schemas rendered bigger than estimated.
PROMPT_OVERHEAD_TOKENS = 300


def multiagent_ctx(a, tools_tokens: int) -> int:
    """--ma-ctx-size, else room for one agent's whole conversation in each slot (+20%): what
    llama-server needs, whose slots each get ctx/np. The system text is at least 100 tokens
    beside the tools (`tools_tokens`, estimated), however small --ma-system-tokens is."""
    if a.ma_ctx_size:
        return a.ma_ctx_size
    system = max(a.ma_system_tokens, tools_tokens + 140)
    per_agent = system + PROMPT_OVERHEAD_TOKENS + a.ma_turns * (a.ma_tool_tokens + a.ma_gen_tokens + 30)
    return round_up(int(per_agent * 1.2) * a.ma_np, 1024)


def make_agents(run: Run) -> list[Agent]:
    """Agents with one session name and system seed (so the system prompt and tools are the
    same bytes for all) and a task and tool results of their own."""
    a = run.a
    return [Agent(run.texts, session="multiagent", system_tokens=a.ma_system_tokens, n_tools=a.ma_tools,
                  tools_in=a.tools_in, tool_lo=a.ma_tool_tokens, tool_hi=a.ma_tool_tokens, turns=a.ma_turns,
                  task_seed=f"multiagent-task-{i}", system_seed="multiagent-system")
            for i in range(a.ma_agents)]


def agent_loop(run: Run, srv: Served, agent: Agent, index: int, t0: float, rows: list[dict]) -> None:
    """One agent's turns, each sent when the previous answer is in; stops at the first failure."""
    a = run.a
    tools = agent.request_tools()
    messages = agent.first_messages()
    for turn in range(1, a.ma_turns + 1):
        if run.budget.spent():
            rows.append({"agent": index, "turn": turn, "ok": False, "error": "time budget spent"})
            return
        body = {**sampling_body(a, a.ma_gen_tokens), "messages": messages}
        if tools:
            body["tools"] = tools
        r = stream(srv.url, "/v1/chat/completions", body, timeout=run.timeout())
        start = r["t_start"] - t0
        rows.append({"agent": index, "turn": turn, "t_start_s": start, "t_end_s": start + (r.get("total_s") or 0.0),
                     **request_record(r)})
        if not r.get("ok") or turn == a.ma_turns:
            return
        reply, call_id = agent.echoed_reply(turn, r)
        result, _ = agent.tool_result(turn - 1)
        messages = messages + [reply, {"role": "tool", "tool_call_id": call_id, "content": result}]


def run_agents(run: Run, srv: Served, agents: list[Agent]) -> list[dict[str, Any]]:
    """All agents at once (released together by a barrier); every request's row."""
    per_agent: list[list[dict]] = [[] for _ in agents]
    at_once(len(agents), lambda i, t0: agent_loop(run, srv, agents[i], i, t0, per_agent[i]), run.timeout() * run.a.ma_turns + 30)
    return [row for rows in per_agent for row in rows]


def summarise_agents(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Computed prompt tokens in all, wall time from the first send to the last answer, latency
    and TTFT percentiles."""
    ok = [r for r in rows if r.get("ok")]
    computed = [r.get("computed_tokens") for r in ok]
    return {
        "requests": len(rows), "ok": len(ok),
        "errors": [r.get("error") for r in rows if not r.get("ok")][:10],
        "computed_tokens_total": sum(computed) if ok and None not in computed else None,
        "prompt_tokens_total": sum(r.get("prompt_tokens") or 0 for r in ok),
        "cached_tokens_total": sum(r.get("cached_tokens") or 0 for r in ok),
        "completion_tokens_total": sum(r.get("completion_tokens") or 0 for r in ok),
        "wall_s": (max(r["t_end_s"] for r in ok) - min(r["t_start_s"] for r in ok)) if ok else None,
        "latency_s_p50": bc.percentile([r.get("total_s") for r in ok], 50),
        "latency_s_p95": bc.percentile([r.get("total_s") for r in ok], 95),
        "ttft_s_p50": bc.percentile([r.get("ttft_s") for r in ok], 50),
        "ttft_s_p95": bc.percentile([r.get("ttft_s") for r in ok], 95),
        "last_prompt_tokens": max((r.get("prompt_tokens") or 0 for r in ok), default=None),
    }


def workload_multiagent(run: Run) -> dict[str, Any]:
    a = run.a
    ctx = multiagent_ctx(a, make_agents(run)[0].tools_token_estimate() if a.ma_agents else 0)
    out: dict[str, Any] = {"settings": {
        "agents": a.ma_agents, "np": a.ma_np, "turns": a.ma_turns, "system_tokens": a.ma_system_tokens,
        "n_tools": a.ma_tools, "tools_in": a.tools_in, "tool_tokens": a.ma_tool_tokens,
        "gen_tokens": a.ma_gen_tokens, "ctx": ctx}, "servers": {}}
    run.result["workloads"]["multiagent"] = out  # each run.save() below writes what is measured so far
    for server in a.servers:
        res: dict[str, Any] = {}
        out["servers"][server] = res
        if run.budget.spent():
            res["skipped"] = "time budget spent"
            continue
        with Served(run, server, a.ma_np, ctx, "multiagent") as srv:
            res["server"] = srv.info
            if not srv.ok:
                continue
            before = srv.state_counters()
            rows = run_agents(run, srv, make_agents(run))
            after = srv.state_counters()
            res.update({"requests": rows, "summary": summarise_agents(rows), "counters_before": before,
                        "counters_after": after, "counters_delta": counters_delta(before, after)})
            s = res["summary"]
            run.log(f"  {server:12s} multiagent: {s['ok']}/{s['requests']} ok, wall {s['wall_s'] or 0:.1f}s, "
                    f"computed {s['computed_tokens_total']} tokens, latency p50 {(s['latency_s_p50'] or 0):.2f}s")
        run.save()
    return out
