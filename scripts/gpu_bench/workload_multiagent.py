"""The `multiagent` workload: more agents than slots, all running their loops at once.

--ma-agents agents share one system prompt and --ma-tools tool schemas (about
--ma-system-tokens in all) and each has its own task. Every agent runs --ma-turns requests
back to back: the conversation so far, a streamed reply of at most --ma-gen-tokens, which is
echoed back as the assistant message (as agents do), then a tool result of --ma-tool-tokens.
With fewer slots (-np --ma-np) than agents, a server either keeps each agent's state somewhere
or computes its prompt again; the computed prompt tokens and the state copies tell which.

Per server:

- wall: the first request sent -> the last answer in; latency and TTFT percentiles;
- computed prompt tokens (llama-server's timings.prompt_n, else prompt - cached) against the
  unique tokens: every agent's conversation once (the prompt of its last answered request)
  and the prefix the agents share (system prompt, tools: the same bytes for all) once, not
  once per agent. `shared_prefix_tokens` is measured on the server itself: the token ids of
  two agents' first requests, rendered as chat requests, up to where they part (None with
  --no-ideal). No server can compute less, but for the replies echoed back, which the server
  decoded itself and may keep: it may compute a little less than the unique tokens;
- warmslot: its /metrics state counters over the run, its state copy bytes
  (`warmslot_state_copy_bytes_total` by cause and direction) and those bytes over the KV
  bytes of the tokens computed (computed tokens x kv_bytes_per_token of /get_server_info):
  the bytes moved between the device and RAM per KV byte computed (0: the states never
  moved); `unique_kv_bytes` is the KV of the unique tokens.
"""

from __future__ import annotations

from typing import Any

from scripts import bench_common as bc
from scripts.bench_client import get_json

from . import WARMSLOT
from .agent import Agent
from .client import at_once, common_prefix, render_tokens, request_record, sampling_body, stream
from .servers import Run, Served, counters_delta, round_up
from .workload_sessions import computed_over_ideal, copy_arithmetic

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


def shared_prefix(run: Run, srv: Served, agents: list[Agent]) -> int | None:
    """The tokens two agents' first requests share (rendered as chat requests on the server);
    0 with one agent (nothing is shared), None with --no-ideal or when a rendering failed."""
    if not run.a.ideal:
        return None
    if len(agents) < 2:
        return 0
    renders = [render_tokens(srv.server, srv.url, agent.first_messages(), agent.request_tools(),
                             run.a.template_kwargs) for agent in agents[:2]]
    return common_prefix(*renders) if all(renders) else None


def unique_tokens(rows: list[dict[str, Any]], shared: int | None) -> int | None:
    """The fewest prompt tokens a server could compute: every agent's conversation once (the
    prompt of its last answered request) and the shared prefix once, not once per agent;
    None when the shared prefix or a prompt is unknown. The replies echoed back were decoded
    by the server already, so a server may compute a little less than this."""
    if shared is None:
        return None
    last: dict[Any, dict[str, Any]] = {}
    for r in rows:
        if r.get("ok") and (r["agent"] not in last or r["turn"] > last[r["agent"]]["turn"]):
            last[r["agent"]] = r
    prompts = [r.get("prompt_tokens") for r in last.values()]
    if None in prompts:
        return None
    return sum(prompts) - max(0, len(last) - 1) * shared


def summarise_agents(rows: list[dict[str, Any]], shared: int | None = None, counters: dict[str, float] | None = None,
                     kv_bytes_per_token: int | None = None) -> dict[str, Any]:
    """Computed prompt tokens in all against the unique tokens, wall time from the first send
    to the last answer, latency and TTFT percentiles; with warmslot's `counters` over the run,
    its state copy bytes against the KV bytes of what it computed."""
    ok = [r for r in rows if r.get("ok")]
    computed = [r.get("computed_tokens") for r in ok]
    out = {
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
        "shared_prefix_tokens": shared, "unique_tokens": unique_tokens(rows, shared),
    }
    out["computed_over_ideal"] = computed_over_ideal(out["computed_tokens_total"], out["unique_tokens"])
    if counters:
        out.update(copy_arithmetic(counters, out["computed_tokens_total"], kv_bytes_per_token))
        unique = out["unique_tokens"]
        out["unique_kv_bytes"] = unique * kv_bytes_per_token if unique is not None and kv_bytes_per_token else None
    return out


def arithmetic_line(s: dict[str, Any]) -> str:
    """The run.log line of a server's computed tokens against the unique ones and, for
    warmslot, its state copies against the KV bytes it computed."""
    def times(v: float | None) -> str:
        return "-" if v is None else f"{v}x"

    line = (f"computed {s['computed_tokens_total']} vs ideal (unique tokens) {s['unique_tokens']} "
            f"({times(s['computed_over_ideal'])})")
    if "state_copy_bytes" in s:
        line += (f"; copied {s['state_copy_bytes']['total'] / 1e9:.2f} GB = {times(s['copy_bytes_over_computed_kv'])} "
                 "the KV bytes computed")
        if s.get("checkpoint_bytes"):
            line += (f", and {s['checkpoint_bytes'] / 1e9:.2f} GB of checkpoints saved and restored "
                     f"({times(s['copy_and_checkpoint_bytes_over_computed_kv'])} with them)")
    return line


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
            agents = make_agents(run)
            shared = shared_prefix(run, srv, agents)
            info = get_json(srv.url, "/get_server_info") if server == WARMSLOT else None
            before = srv.state_counters()
            rows = run_agents(run, srv, agents)
            after = srv.state_counters()
            delta = counters_delta(before, after)
            summary = summarise_agents(rows, shared, delta if server == WARMSLOT else None,
                                       (info or {}).get("kv_bytes_per_token"))
            res.update({"requests": rows, "summary": summary, "counters_before": before, "counters_after": after,
                        "counters_delta": delta})
            s = res["summary"]
            run.log(f"  {server:12s} multiagent: {s['ok']}/{s['requests']} ok, wall {s['wall_s'] or 0:.1f}s, "
                    f"latency p50 {(s['latency_s_p50'] or 0):.2f}s, {arithmetic_line(s)}")
        run.save()
    return out
