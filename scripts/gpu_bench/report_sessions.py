"""The report's `sessions` section: more Claude Code sessions at once than slots, per S:P the
wall time, computed tokens against the ideal and TTFT of both servers, and warmslot's state
copies against the KV bytes of what it computed."""

from __future__ import annotations

from typing import Any

import copy

from . import LLAMA_SERVER, SERVERS, WARMSLOT
from .markdown import counters_table, fmt, ms, ratio, rx, table
from .workload_sessions import compare


def merge_sessions(older: dict[str, Any], newer: dict[str, Any]) -> dict[str, Any]:
    """One `sessions` workload from two result files' (runs split over several calls, e.g.
    one S:P or one server per call): per server and S:P the newer run wins, unless only the
    older one measured anything (the newer skipped or failed); the comparison is made again."""
    out = copy.deepcopy(newer)
    servers = out.setdefault("servers", {})
    for server, res in (older.get("servers") or {}).items():
        runs = servers.setdefault(server, {"runs": {}}).setdefault("runs", {})
        for label, run in (res.get("runs") or {}).items():
            if label not in runs or (run.get("summary") and not runs[label].get("summary")):
                runs[label] = run
    settings = out.setdefault("settings", {})
    labels = (older.get("settings") or {}).get("runs") or []
    settings["runs"] = [x for x in labels if x not in (settings.get("runs") or [])] + list(settings.get("runs") or [])
    out["comparison"] = compare(out)
    return out


def runs_table(w: dict[str, Any]) -> str:
    rows = []
    for label in (w.get("settings") or {}).get("runs") or []:
        for server in SERVERS:
            r = ((w.get("servers") or {}).get(server) or {}).get("runs", {}).get(label)
            if r is None:
                continue
            s = r.get("summary") or {}
            status = f"{s.get('ok')}/{s.get('requests')}" if s else (r.get("skipped") or "server failed")
            copies = (s.get("state_copy_bytes") or {}).get("total")
            rows.append([label, server, status, fmt(s.get("wall_s")), s.get("computed_tokens_total"),
                         s.get("ideal_computed_total"), fmt(s.get("computed_over_ideal"), 3),
                         f"{ms(s.get('main_ttft_s_p50'))} ({s.get('main_ttft_n', '-')})",
                         "-" if copies is None else f"{copies / 1e9:,.2f}", fmt(s.get("copy_bytes_over_computed_kv"))])
    return table(["S:P", "server", "requests", "wall s", "computed", "ideal", "computed / ideal",
                  "main TTFT p50 ms (requests)", "state copies GB", "copies / KV of computed"], rows)


def ratio_lines(w: dict[str, Any]) -> list[str]:
    out = []
    for label, c in (w.get("comparison") or {}).items():
        wall, ttft = c.get("wall_s") or {}, c.get("main_ttft_s_p50") or {}
        out.append(f"- {label}: wall warmslot / llama-server {rx(ratio(wall.get(WARMSLOT), wall.get(LLAMA_SERVER)))}, "
                   f"main TTFT p50 {rx(ratio(ttft.get(WARMSLOT), ttft.get(LLAMA_SERVER)))}")
    return out


def sessions_section(w: dict[str, Any]) -> str:
    st = w.get("settings") or {}
    text = (f"Claude-Code-shaped sessions, S at once on -np P (S:P {', '.join(st.get('runs') or [])}; scale "
            f"{st.get('scale')}, {st.get('requests')} requests per session: {' '.join(st.get('schedule') or [])}, "
            f"at most {st.get('gen_tokens')} tokens each; billing header varying: {st.get('billing_varies')}). "
            "Wall: the first request sent to the last reply done. Ideal: each agent's new tokens, the prefix the "
            f"sessions share once per run. Main TTFT p50: over the main agent's requests adding fewer than "
            f"{st.get('small_new_tokens')} tokens. Copies / KV of computed: warmslot's state copy bytes over "
            "computed tokens x KV bytes per token.\n\n" + runs_table(w))
    lines = ratio_lines(w)
    if lines:
        text += "\n\n" + "\n".join(lines)
    columns = {label: ((w.get("servers") or {}).get(WARMSLOT) or {}).get("runs", {}).get(label, {}).get("counters")
               for label in st.get("runs") or []}
    counters = counters_table({label: c for label, c in columns.items() if c})
    if counters:
        text += "\n\nwarmslot's counters over each run:\n\n" + counters
    return text
