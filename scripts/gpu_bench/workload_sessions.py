"""The `sessions` workload: more Claude Code sessions at once than the server has slots.

Each `S:P` of --sess-runs is one server run per server (a fresh server each time, -np P, the
runs in turn, both servers per run before the next) in which S sessions
(claude_code_sessions.py: a main agent and a background sub-agent, today's request shapes
with --sess-shapes current) run at once: one client thread per session sends its
--sess-requests requests one after another, each streamed through /v1/messages as
workload_messages.stream_messages does, the next when the previous answer is in. A request
the server refuses is recorded with its status and error and its session goes on.

The context (--sess-ctx-size 0) is -np x the longest prompt a session reaches, +30%, the
same for both servers; warmslot keeps its defaults, llama-server its own (`--cache-ram`
and each slot getting ctx/np among them). With S > P, a server either keeps each session's
state somewhere (RAM) or computes it again.

Per request: the session, the agent (main, sub, title), the prompt, cached and computed
tokens (usage of message_start / message_delta), the TTFT (request sent -> first
content_block_delta), and the new tokens: the prompt less the prompt of the same agent's
previous request in the session (its whole prompt on its first request).

Per run and server:

- wall: the first request sent -> the last reply done;
- computed prompt tokens against the ideal. The ideal counts each agent's new tokens as
  above, with the prefix its first request shares with the other sessions' (the system
  prompt and tools, the same bytes in every session) counted once per server run, not once
  per session: a prefix the server has computed once can be kept (it is the head of every
  session's prompt for the whole run) and shared, or, for the first requests that all come
  at once, computed once while the others wait for it; no server can compute less. The
  shared prefix is measured on the server itself: the token ids of two sessions' first
  requests of an agent, rendered as chat requests (system, tools, the task), up to where they
  part (`shared_prefix_tokens`; `ideal_per_agent_total` counts it per session instead).
  The prompts of different agents also share the chat template's first few tokens, which
  the ideal counts as new: a server may compute a few tokens per agent less than the ideal;
- the main agent's TTFT p50 over its requests with fewer than 500 new tokens (what those
  wait for is mostly the session's state, not the prefill of what is new);
- warmslot: the deltas of its /metrics state counters over the run
  (`warmslot_state_copy_bytes_total` by cause: load is RAM -> device, the others device ->
  RAM), and those bytes over the KV bytes of the tokens computed (state copy bytes /
  (computed tokens x kv_bytes_per_token of /get_server_info)): the bytes moved between the
  device and RAM per KV byte the server computed (0: the states never moved).

The comparison gives, per S:P, the wall ratio warmslot / llama-server, both servers'
computed tokens against the ideal, the TTFT p50s and warmslot's bytes ratio.
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path
from typing import Any

from scripts import bench_common as bc
from scripts.bench_client import get_json

from . import LLAMA_SERVER, WARMSLOT
from .claude_code_sessions import UserSession, chat_form, longest_prompt, session_schedule
from .claude_code_shapes import SHAPES
from .client import at_once, common_prefix, render_tokens
from .profiling import record_profile, stop_profile
from .servers import Run, Served, counters_delta, round_up
from .workload_messages import add_ideal, request_row, stream_messages

SMALL_NEW_TOKENS = 500  # a request that adds fewer tokens than this waits mostly for its session's state
COPY_COUNTER = "warmslot_state_copy_bytes_total"
TO_DEVICE_CAUSES = ("load",)  # the other causes (overwrite, park, spill, sleep) copy to RAM


def add_sessions_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sess-runs", default="4:2,16:4",
                   help="S:P,...: one server run per entry, S sessions at once on -np P")
    p.add_argument("--sess-scale", type=float, default=1.0,
                   help="scale of every size (1: a ~20K-token main system prompt and tools, ~6K for the sub-agent, "
                        "tool results of 2K-9K and 60-400 tokens; 0.03 for a CPU run)")
    p.add_argument("--sess-requests", type=int, default=15, help="requests per session (main, sub and title)")
    p.add_argument("--sess-gen-tokens", type=int, default=16, help="max_tokens of each request")
    p.add_argument("--sess-billing", default="cch", choices=("version", "cch"),
                   help="what changes in the billing header of every request: cch only (default; llama-server "
                        "normalizes it, warmslot drops the header), or cc_version too")
    p.add_argument("--sess-shapes", default="current", choices=SHAPES, help="as --msg-shapes")
    p.add_argument("--sess-ctx-size", type=int, default=0,
                   help="0: -np x the longest prompt of a session, +30%% (llama-server's slots get ctx/np each)")


def parse_sessions_runs(a: argparse.Namespace) -> None:
    """--sess-runs as [(S, P), ...]; ValueError on a bad entry."""
    if not isinstance(a.sess_runs, str):
        return
    runs = []
    for item in (x.strip() for x in a.sess_runs.split(",")):
        m = re.fullmatch(r"(\d+):(\d+)", item)
        if not m or int(m[1]) < 1 or int(m[2]) < 1:
            raise ValueError(f"--sess-runs takes S:P entries with S, P >= 1, e.g. 4:2,16:4 (got {item!r})")
        runs.append((int(m[1]), int(m[2])))
    a.sess_runs = runs


def sessions_ctx(a: argparse.Namespace, session: UserSession, np_: int) -> int:
    if a.sess_ctx_size:
        return a.sess_ctx_size
    return context_for(session, a.sess_requests, a.sess_gen_tokens, np_)


def context_for(session: UserSession, requests: int, gen_tokens: int, np_: int) -> int:
    """-np x the longest prompt of `session`'s schedule and its reply, +30%."""
    longest = longest_prompt(session, session_schedule(requests, session.current)) + gen_tokens
    return round_up(int(longest * 1.3) * np_, 1024)


def with_new_tokens(per_session: list[list[dict]]) -> list[dict]:
    """The rows of every session, each with its new tokens: its prompt less the prompt of the
    same agent's previous request in the session."""
    out = []
    for rows in per_session:
        add_ideal(rows)
        for row in rows:
            row["new_tokens"] = row.pop("ideal_computed", None)
        out += rows
    return out


def ttft_p50(rows: list[dict], agent: str) -> tuple[float | None, int]:
    """The TTFT p50 of `agent`'s answered requests that added fewer than SMALL_NEW_TOKENS, and
    how many there were."""
    sel = [r["ttft_s"] for r in rows if r.get("ok") and r["agent"] == agent and r.get("ttft_s") is not None
           and r.get("new_tokens") is not None and r["new_tokens"] < SMALL_NEW_TOKENS]
    return bc.percentile(sel, 50), len(sel)


def make_sessions(run: Run, n: int) -> list[UserSession]:
    a = run.a
    return [UserSession(run.texts, i, scale=a.sess_scale, gen_tokens=a.sess_gen_tokens, billing=a.sess_billing,
                        shapes=a.sess_shapes) for i in range(n)]


def session_bodies(sessions: list[UserSession], requests: int) -> list[list[dict]]:
    """Every request body of every session, made before the clock starts (texts are made once
    the first server has calibrated them, then the same for every server)."""
    return [[s.body(step, s.billing_index(i)) for i, step in enumerate(session_schedule(requests, s.current))]
            for s in sessions]


def shared_prefixes(run: Run, srv: Served, bodies: list[list[dict]], steps: list) -> dict[str, int | None]:
    """Per agent, the tokens its first request shares with another session's (rendered as a
    chat request on the server); {} with one session or --no-ideal."""
    if len(bodies) < 2 or not run.a.ideal:
        return {}
    out: dict[str, int | None] = {}
    for i, step in enumerate(steps):
        if step.base is not None or step.agent in out:
            continue
        renders = [render_tokens(srv.server, srv.url, *chat_form(b[i]), run.a.template_kwargs) for b in bodies[:2]]
        out[step.agent] = common_prefix(*renders) if all(renders) else None
    return out


def session_client(run: Run, srv: Served, session: UserSession, bodies: list[dict], t0: float,
                   rows: list[dict]) -> None:
    """One session's requests, one after another; a refused one is recorded and the next sent."""
    steps = session_schedule(run.a.sess_requests, session.current)
    for i, (step, body) in enumerate(zip(steps, bodies)):
        head = {"session": session.index, "index": i, "agent": step.agent, "tool_results": step.n_results,
                "base": step.base}
        if run.budget.spent():
            rows.append({**head, "ok": False, "error": "time budget spent"})
            break
        start = time.perf_counter()
        r = stream_messages(srv.url, body, timeout=run.timeout(), path=session.path(), headers=session.headers(step))
        end = time.perf_counter()
        rows.append({**head, "t_start_s": round(start - t0, 4), "t_end_s": round(end - t0, 4),
                     **request_row(r)})
        row = rows[-1]
        run.log(f"  {srv.server:12s} session {session.index:2d} #{i:2d} {step.agent:5s}: HTTP {row['status']} prompt "
                f"{row['prompt_tokens']} cached {row['cached_tokens']} TTFT {(row['ttft_s'] or 0) * 1000:.0f} ms"
                + (f" ERROR {row['error'][:200]}" if row.get("error") else ""))


def run_sessions(run: Run, srv: Served, sessions: list[UserSession], bodies: list[list[dict]]) -> list[dict]:
    """All sessions at once (released together by a barrier); every request's row, with its
    new tokens (the prompt less the same agent's previous prompt in the session)."""
    per_session: list[list[dict]] = [[] for _ in sessions]
    at_once(len(sessions), lambda k, t0: session_client(run, srv, sessions[k], bodies[k], t0, per_session[k]),
            run.timeout() * run.a.sess_requests + 30)
    return with_new_tokens(per_session)


def copy_bytes(counters: dict[str, float]) -> dict[str, Any]:
    """warmslot's state copy bytes over the run: in all, by cause and by direction (a
    `direction` label where /metrics has one, else the cause's)."""
    by_cause: dict[str, float] = {}
    by_direction = {"to_device": 0.0, "to_ram": 0.0}
    for key, value in counters.items():
        if not key.startswith(COPY_COUNTER + "{"):
            continue
        labels = dict(kv.split("=", 1) for kv in key[len(COPY_COUNTER) + 1:-1].split(",") if "=" in kv)
        cause = labels.get("cause", "?")
        by_cause[cause] = by_cause.get(cause, 0.0) + value
        direction = labels.get("direction") or ("to_device" if cause in TO_DEVICE_CAUSES else "to_ram")
        by_direction[direction] = by_direction.get(direction, 0.0) + value
    return {"total": sum(by_cause.values()), "by_cause": by_cause, "by_direction": by_direction}


def computed_over_ideal(computed: int | None, ideal: int | None) -> float | None:
    """computed / ideal to 4 decimals: how many times the fewest tokens a server could compute
    it computed; None when either is unknown or the ideal is 0."""
    return round(computed / ideal, 4) if computed is not None and ideal else None


CHECKPOINT_COUNTERS = ("warmslot_checkpoint_saved_bytes_total", "warmslot_checkpoint_restored_bytes_total")


def copy_arithmetic(counters: dict[str, float], computed: int | None,
                    kv_bytes_per_token: int | None) -> dict[str, Any]:
    """warmslot's state copy bytes (copy_bytes) and those bytes over the KV bytes of the
    `computed` tokens: the bytes moved between the device and RAM per KV byte computed.
    Checkpoints (the partial states of sliding-window, recurrent and hybrid memory, read at
    chosen positions and written back on a restore) cross between them too: their bytes,
    saved and restored, are counted apart and then with the copies."""
    copies = copy_bytes(counters)
    checkpoints = sum(counters.get(name, 0.0) for name in CHECKPOINT_COUNTERS)
    computed_kv = (computed or 0) * (kv_bytes_per_token or 0)

    def per_kv(n: float) -> float | None:
        return round(n / computed_kv, 4) if computed_kv else None

    return {"state_copy_bytes": copies, "kv_bytes_per_token": kv_bytes_per_token,
            "copy_bytes_over_computed_kv": per_kv(copies["total"]), "checkpoint_bytes": checkpoints,
            "copy_and_checkpoint_bytes_over_computed_kv": per_kv(copies["total"] + checkpoints)}


def summarise(rows: list[dict], shared: dict[str, int | None], counters: dict[str, float],
              kv_bytes_per_token: int | None) -> dict[str, Any]:
    ok = [r for r in rows if r.get("ok")]
    sent = [r for r in rows if r.get("t_start_s") is not None]

    def total(key: str, sel: list[dict]) -> int | None:
        vals = [r.get(key) for r in sel]
        return None if not sel or any(v is None for v in vals) else int(sum(vals))

    out: dict[str, Any] = {
        "sessions": len({r["session"] for r in rows}), "requests": len(rows), "ok": len(ok),
        "errors": [f"session {r['session']} #{r['index']} {r['agent']}: {r.get('error')}" for r in rows
                   if not r.get("ok")][:5],
        "errors_by_agent": {agent: sum(1 for r in rows if r["agent"] == agent and not r.get("ok"))
                            for agent in dict.fromkeys(r["agent"] for r in rows)},
        "wall_s": round(max(r["t_end_s"] for r in sent) - min(r["t_start_s"] for r in sent), 3) if sent else None,
        "prompt_tokens_total": total("prompt_tokens", ok), "cached_tokens_total": total("cached_tokens", ok),
        "computed_tokens_total": total("computed_tokens", ok), "ideal_per_agent_total": total("new_tokens", ok),
        "shared_prefix_tokens": shared, "longest_prompt_tokens": max((r.get("prompt_tokens") or 0 for r in ok),
                                                                     default=None),
    }
    (out["main_ttft_s_p50"], out["main_ttft_n"]), (out["sub_ttft_s_p50"], out["sub_ttft_n"]) = \
        ttft_p50(ok, "main"), ttft_p50(ok, "sub")
    ideal = out["ideal_per_agent_total"]
    if ideal is not None:
        for agent, tokens in shared.items():  # the shared prefix once per run, not once per session
            firsts = sum(1 for r in ok if r["agent"] == agent and r["base"] is None and r.get("new_tokens"))
            ideal -= max(0, firsts - 1) * (tokens or 0)
        out["ideal_shared_once"] = bool(shared) and all(v is not None for v in shared.values())
    out["ideal_computed_total"] = ideal
    ratio = computed_over_ideal(out["computed_tokens_total"], ideal)
    if ratio is not None:
        out["computed_over_ideal"] = ratio
    if counters:
        out.update(copy_arithmetic(counters, out["computed_tokens_total"], kv_bytes_per_token))
    return out


def run_label(sessions: int, np_: int) -> str:
    return f"{sessions}:{np_}"


def workload_sessions(run: Run) -> dict[str, Any]:
    a = run.a
    parse_sessions_runs(a)
    probe = make_sessions(run, 1)[0]
    steps = session_schedule(a.sess_requests, probe.current)
    out: dict[str, Any] = {"settings": {
        "runs": [run_label(s, p) for s, p in a.sess_runs], "scale": a.sess_scale, "requests": a.sess_requests,
        "gen_tokens": a.sess_gen_tokens, "billing_varies": a.sess_billing, "shapes": a.sess_shapes,
        "small_new_tokens": SMALL_NEW_TOKENS, "longest_prompt_estimate": longest_prompt(probe, steps),
        "schedule": [f"{s.agent}:{s.n_results}" for s in steps]}, "servers": {s: {"runs": {}} for s in a.servers}}
    run.result["workloads"]["sessions"] = out  # each run.save() below writes what is measured so far
    bodies: dict[int, list[list[dict]]] = {}
    for n_sessions, np_ in a.sess_runs:
        label = run_label(n_sessions, np_)
        for server in a.servers:
            entry: dict[str, Any] = {}
            out["servers"][server]["runs"][label] = entry
            if run.budget.spent():
                entry["skipped"] = "time budget spent"
                continue
            with Served(run, server, np_, sessions_ctx(a, probe, np_), f"sessions-s{n_sessions}-np{np_}") as srv:
                entry["server"] = srv.info
                if not srv.ok:
                    continue
                sessions = make_sessions(run, n_sessions)
                if n_sessions not in bodies:
                    bodies[n_sessions] = session_bodies(sessions, a.sess_requests)
                shared = shared_prefixes(run, srv, bodies[n_sessions], steps)
                info = get_json(srv.url, "/get_server_info") if server == WARMSLOT else None
                run.log(f"sessions {label} on {server}: {n_sessions} sessions at once on -np {np_}")
                profiler, note = (None, {})
                if server == WARMSLOT and a.profile_warmslot > 0:
                    path = Path(a.out).with_name(f"{Path(a.out).stem}-sessions-{label.replace(':', 'on')}-warmslot.pyspy.txt")
                    profiler, note = record_profile(srv.pid, a.profile_warmslot, a.profile_rate, path, a.python)
                before = srv.state_counters()
                entry["requests"] = run_sessions(run, srv, sessions, bodies[n_sessions])
                entry["counters"] = counters_delta(before, srv.state_counters())
                note = stop_profile(profiler, note)
                if note:
                    entry["profile"] = note
                entry["summary"] = summarise(entry["requests"], shared, entry["counters"] if server == WARMSLOT else {},
                                             (info or {}).get("kv_bytes_per_token"))
                s = entry["summary"]
                run.log(f"  {server:12s} sessions {label}: {s['ok']}/{s['requests']} ok, wall {s['wall_s']} s, "
                        f"computed {s['computed_tokens_total']} vs ideal {s['ideal_computed_total']}")
            run.save()
    out["comparison"] = compare(out)
    return out


def compare(out: dict[str, Any]) -> dict[str, Any]:
    """Per S:P: wall warmslot / llama-server, computed against the ideal, the main agent's
    TTFT p50, and warmslot's copy bytes over the KV bytes of what it computed."""
    def ratio(x: float | None, y: float | None) -> float | None:
        r = bc.ratio(x, y)
        return None if r is None else round(r, 4)

    cmp: dict[str, Any] = {}
    servers = out.get("servers") or {}
    for label in (out.get("settings") or {}).get("runs") or []:
        s = {srv: ((servers.get(srv) or {}).get("runs", {}).get(label) or {}).get("summary") or {}
             for srv in (WARMSLOT, LLAMA_SERVER)}
        ws, ls = s[WARMSLOT], s[LLAMA_SERVER]
        cmp[label] = {
            "wall_s": {WARMSLOT: ws.get("wall_s"), LLAMA_SERVER: ls.get("wall_s")},
            "wall_ratio_warmslot_over_llama_server": ratio(ws.get("wall_s"), ls.get("wall_s")),
            "computed": {srv: s[srv].get("computed_tokens_total") for srv in s},
            "ideal": {srv: s[srv].get("ideal_computed_total") for srv in s},
            "computed_over_ideal": {srv: s[srv].get("computed_over_ideal") for srv in s},
            "main_ttft_s_p50": {srv: s[srv].get("main_ttft_s_p50") for srv in s},
            "ttft_ratio_warmslot_over_llama_server": ratio(ws.get("main_ttft_s_p50"), ls.get("main_ttft_s_p50")),
            "warmslot_copy_bytes": (ws.get("state_copy_bytes") or {}).get("total"),
            "warmslot_copy_bytes_over_computed_kv": ws.get("copy_bytes_over_computed_kv"),
            "errors": {srv: s[srv].get("errors_by_agent") for srv in s},
        }
    return cmp
