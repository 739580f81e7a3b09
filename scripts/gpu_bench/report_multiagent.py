"""The report's `multiagent` section: computed prompt tokens against the unique tokens, wall
time and latencies of agents sharing fewer slots than there are agents, warmslot /
llama-server, and warmslot's state copies against the KV bytes of what it computed."""

from __future__ import annotations

from typing import Any

from . import LLAMA_SERVER, SERVERS, WARMSLOT
from .markdown import counters_table, fmt, ms, ratio, rx, table


def agents_table(servers: dict[str, Any]) -> str:
    rows = []
    for server in SERVERS:
        res = servers.get(server)
        if res is None:
            continue
        s = res.get("summary") or {}
        status = f"{s.get('ok')}/{s.get('requests')}" if s else (res.get("skipped") or "server failed")
        rows.append([server, status, s.get("prompt_tokens_total"), s.get("cached_tokens_total"),
                     s.get("computed_tokens_total"), s.get("unique_tokens"), fmt(s.get("computed_over_ideal"), 3),
                     fmt(s.get("wall_s")), fmt(s.get("latency_s_p50")), fmt(s.get("latency_s_p95")),
                     ms(s.get("ttft_s_p50")), ms(s.get("ttft_s_p95"))])
    return table(["server", "requests", "prompt tokens", "cached", "computed", "unique tokens", "computed / unique",
                  "wall s", "latency p50 s", "latency p95 s", "TTFT p50 ms", "TTFT p95 ms"], rows)


def ratios_line(servers: dict[str, Any]) -> str:
    ws = (servers.get(WARMSLOT) or {}).get("summary") or {}
    ls = (servers.get(LLAMA_SERVER) or {}).get("summary") or {}
    pairs = [("computed prompt tokens", "computed_tokens_total"), ("wall", "wall_s"),
             ("latency p50", "latency_s_p50"), ("TTFT p50", "ttft_s_p50")]
    return "warmslot / llama-server: " + ", ".join(f"{name} {rx(ratio(ws.get(k), ls.get(k)))}" for name, k in pairs)


def copies_line(servers: dict[str, Any]) -> str:
    """warmslot's state copy bytes against the KV bytes of the tokens it computed; '' when it
    has no copy counters."""
    s = (servers.get(WARMSLOT) or {}).get("summary") or {}
    copies = (s.get("state_copy_bytes") or {}).get("total")
    if copies is None:
        return ""
    line = (f"warmslot's state copies: {copies / 1e9:,.2f} GB = {fmt(s.get('copy_bytes_over_computed_kv'), 3)}x the "
            f"KV bytes of the tokens it computed ({s.get('kv_bytes_per_token') or '-'} bytes per token).")
    if s.get("checkpoint_bytes"):
        line += (f" Checkpoints saved and restored: {s['checkpoint_bytes'] / 1e9:,.2f} GB more "
                 f"({fmt(s.get('copy_and_checkpoint_bytes_over_computed_kv'), 3)}x with the copies).")
    return line


def multiagent_section(w: dict[str, Any]) -> str:
    st = w.get("settings") or {}
    servers = w.get("servers") or {}
    text = (f"{st.get('agents')} agents at once on -np {st.get('np')} (-c {st.get('ctx')}): a shared system prompt "
            f"with {st.get('n_tools')} tools (about {st.get('system_tokens')} tokens), {st.get('turns')} turns each; "
            f"every reply (at most {st.get('gen_tokens')} tokens) is echoed back with a tool result of about "
            f"{st.get('tool_tokens')} tokens. Wall: the first send to the last answer. Unique tokens: every "
            "agent's conversation once and the prefix the agents share once (a server may compute a little less: "
            "it decoded the replies echoed back).\n\n" + agents_table(servers) + "\n\n" + ratios_line(servers))
    copies = copies_line(servers)
    if copies:
        text += "\n\n" + copies
    warning = ((servers.get(LLAMA_SERVER) or {}).get("server") or {}).get("warning")
    if warning:
        text += f"\n\nllama-server: {warning}."
    counters = counters_table({server: res.get("counters_delta") or {} for server, res in servers.items()
                               if res.get("summary")})
    if counters:
        text += "\n\nCounters over the run (warmslot's include its state copies: bytes and seconds):\n\n" + counters
    return text
