"""The `models` workload: one server, two models by name. Claude Code sessions whose agents
(main and sub-agent) ask for the big model (-m) and whose side requests ask for the small one
(--mod-small), as Claude Code sends its "small fast model" requests.

Both models are served from one folder (`--models-dir`, the GGUFs linked under their file
names): warmslot serves them in its process, llama-server in router mode starts a child
server per model. The flags of the run (-c from --mod-ctx-size, -np, -fa, ...) go to both
models on both servers.

Per server, in turn:

1. **Start** (`ready_s`): until /health answers. Neither server loads a model yet.
2. **Load on demand**: one tiny request to the small model, then one to the big one, each
   timed to its last byte (`load_s`: the load and a one-token answer).
3. **Sessions**: --mod-sessions claude_code_sessions.py sessions at once, each sending its
   --mod-requests requests one after another (main, the session title, sub-agent), streamed
   through /v1/messages, the big model's name on main and sub, the small one's on the title.
   With every main request, a **side request** (a command check: a short system prompt and
   the command, to the small model) is sent at the same moment, on its own thread.
4. **Side requests alone**: --mod-side-alone side requests one after another with nothing
   else running: what a side request takes when it waits behind nothing.
5. **Memory**, with both models loaded: the device memory used (nvidia-smi, less what was
   used before the server started) and the resident memory of the server's process tree
   (llama-server's children included).

Reported per server: the main agent's TTFT p50 (requests with fewer than 500 new tokens, as
the `sessions` workload counts them), the side requests' TTFT and total time during the
sessions (p50, p95, max) against alone, the load times and the memory. A side request that
waited behind a main request's prefill shows as a TTFT far above its time alone.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from scripts import bench_common as bc
from scripts import server_process as sp

from . import LLAMA_SERVER, WARMSLOT
from .claude_code_sessions import UserSession, session_schedule
from .claude_code_shapes import headers as side_headers
from .client import at_once
from .servers import Run
from .text import random_sentence
from .workload_messages import request_row, stream_messages
from .workload_sessions import context_for, ttft_p50, with_new_tokens

COMMANDS = ("git status", "npm test -- --watch=false", "ls -la src/", "pytest -x tests/test_api.py", "cat README.md",
            "grep -rn TODO src/", "make build", "python -m pip list", "git diff HEAD~1", "docker compose ps")


def add_models_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mod-small", default=None, help="the small model's GGUF (side requests); -m is the big one")
    p.add_argument("--mod-sessions", type=int, default=1, help="Claude Code sessions at once")
    p.add_argument("--mod-np", type=int, default=2, help="-np of each model")
    p.add_argument("--mod-requests", type=int, default=15, help="requests per session (main, title, sub-agent)")
    p.add_argument("--mod-scale", type=float, default=1.0, help="as --sess-scale")
    p.add_argument("--mod-gen-tokens", type=int, default=16, help="max_tokens of each request")
    p.add_argument("--mod-side-tokens", type=int, default=700, help="the side requests' system prompt, at scale 1")
    p.add_argument("--mod-side-alone", type=int, default=8, help="side requests sent alone after the sessions")
    p.add_argument("--mod-ctx-size", type=int, default=0, help="0: -np x the longest prompt, +30%%")


def model_name(path: str) -> str:
    return Path(path).name.removesuffix(".gguf")


def models_folder(run: Run) -> Path:
    """A folder holding both GGUFs (links), as both servers' --models-dir."""
    out = Path(run.a.out).resolve()
    folder = out.parent / f"{out.stem}-models-dir"  # one per run: runs may share the folder of their results
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for path in (run.a.model, run.a.mod_small):
        os.symlink(Path(path).resolve(), folder / Path(path).name)
    return folder


def command(run: Run, server: str, folder: Path, ctx: int) -> list[str]:
    flags = ["--models-dir", str(folder), *run.flags(server, run.a.mod_np, ctx)]
    if server == WARMSLOT:
        return [run.a.python or sys.executable, "-m", "warmslot.server", *flags]
    return [str(run.llama_server or run.a.llama_server or "llama-server"), *flags]


def side_body(texts, index: int, model: str, gen_tokens: int, system_tokens: int) -> dict[str, Any]:
    """A command check, as Claude Code asks its small model before it runs a Bash command."""
    rng = random.Random(f"side:{index}")
    policy = ("Your task is to process Bash commands that an AI coding agent wants to run. Say the command's "
              "prefix, or command_injection_detected.\n\n" + texts.text("prose", "side-policy", max(system_tokens, 20)))
    command_text = f"{rng.choice(COMMANDS)} # {random_sentence(rng, 3, 8)}"
    return {"model": model, "max_tokens": gen_tokens, "stream": True,
            "system": [{"type": "text", "text": policy}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": f"Command: {command_text}\nOutput:"}]}]}


def gpu_used_mib() -> int | None:
    """Device memory in use on the GPUs this process sees (CUDA_VISIBLE_DEVICES), in MiB."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    select = ["-i", visible] if visible and all(x.strip().isdigit() for x in visible.split(",")) else []
    try:
        out = subprocess.run(["nvidia-smi", *select, "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
        return sum(int(x) for x in out.split())
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of `pid` and every descendant (from /proc)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry))
            rss[int(entry)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        todo += children.get(p, [])
    return total


def percentiles(values: list[float]) -> dict[str, float | None]:
    return {"p50": bc.percentile(values, 50), "p95": bc.percentile(values, 95), "max": max(values) if values else None,
            "n": len(values)}


def run_sessions(run: Run, url: str, sessions: list[UserSession], big: str, small: str) -> tuple[list[dict], list[dict]]:
    a = run.a
    steps = session_schedule(a.mod_requests, sessions[0].current)
    bodies = [[s.body(step, s.billing_index(i)) for i, step in enumerate(steps)] for s in sessions]
    main_rows: list[list[dict]] = [[] for _ in sessions]
    side_rows: list[dict] = []
    lock = threading.Lock()

    def side(index: int, t0: float) -> None:
        body = side_body(run.texts, index, small, a.mod_gen_tokens, int(a.mod_side_tokens * a.mod_scale))
        start = time.perf_counter()
        r = stream_messages(url, body, timeout=run.timeout(), headers=side_headers(side=True))
        row = {"index": index, "t_start_s": round(start - t0, 4), **request_row(r)}
        with lock:
            side_rows.append(row)

    def client(k: int, t0: float) -> None:
        session = sessions[k]
        threads = []
        for i, (step, body) in enumerate(zip(steps, bodies[k])):
            body = {**body, "model": small if step.agent == "title" else big}
            head = {"session": k, "index": i, "agent": step.agent, "base": step.base}
            if step.agent == "main":  # its side request goes at the same moment
                t = threading.Thread(target=side, args=(k * 1000 + i, t0), daemon=True)
                t.start()
                threads.append(t)
            start = time.perf_counter()
            r = stream_messages(url, body, timeout=run.timeout(), path=session.path(), headers=session.headers(step))
            end = time.perf_counter()
            main_rows[k].append({**head, "t_start_s": round(start - t0, 4), "t_end_s": round(end - t0, 4),
                                 **request_row(r)})
            row = main_rows[k][-1]
            run.log(f"  session {k} #{i:2d} {step.agent:5s} ({body['model']}): HTTP {row['status']} prompt "
                    f"{row['prompt_tokens']} cached {row['cached_tokens']} TTFT {(row['ttft_s'] or 0) * 1000:.0f} ms"
                    + (f" ERROR {row['error'][:200]}" if row.get("error") else ""))
        for t in threads:
            t.join(run.timeout())

    at_once(len(sessions), client, run.timeout() * a.mod_requests + 60)
    return with_new_tokens(main_rows), sorted(side_rows, key=lambda r: r["index"])


def one_server(run: Run, server: str, folder: Path, ctx: int) -> dict[str, Any]:
    a = run.a
    big, small = model_name(a.model), model_name(a.mod_small)
    entry: dict[str, Any] = {"models": {"big": big, "small": small}}
    cmd = command(run, server, folder, ctx)
    entry["command"] = cmd
    log_path = run.log_dir / f"models-{server}.log" if run.log_dir else None
    gpu_before = gpu_used_mib()
    run.log(f"starting {server} (models): {' '.join(cmd)}")
    t = time.perf_counter()
    try:
        env = sp.source_env(a.warmslot_src) if server == WARMSLOT else None
        proc = sp.ServerProcess(server, cmd, env=env, log_path=log_path, ready_timeout=a.ready_timeout)
    except Exception as exc:  # noqa: BLE001 - recorded
        entry["error"] = f"{type(exc).__name__}: {exc}"[:4000]
        return entry
    try:
        entry["ready_s"] = round(time.perf_counter() - t, 2)
        url = proc.url
        entry["load_s"] = {}
        for name in (small, big):  # load on demand: a one-token request each
            t = time.perf_counter()
            r = stream_messages(url, {"model": name, "max_tokens": 1, "stream": True,
                                      "messages": [{"role": "user", "content": "Hi"}]}, timeout=a.ready_timeout)
            entry["load_s"][name] = round(time.perf_counter() - t, 3)
            entry.setdefault("load_requests", {})[name] = request_row(r)
            run.log(f"  {server}: {name} answered its first request in {entry['load_s'][name]:.2f} s (HTTP {r.get('status')})")
        sessions = [UserSession(run.texts, i, scale=a.mod_scale, gen_tokens=a.mod_gen_tokens, billing="cch",
                                shapes="current") for i in range(a.mod_sessions)]
        rows, sides = run_sessions(run, url, sessions, big, small)
        alone = []
        for j in range(a.mod_side_alone):
            body = side_body(run.texts, 900_000 + j, small, a.mod_gen_tokens, int(a.mod_side_tokens * a.mod_scale))
            alone.append(request_row(stream_messages(url, body, timeout=run.timeout(), headers=side_headers(side=True))))
        entry["memory"] = {"gpu_used_mib": (lambda now: None if now is None or gpu_before is None else now - gpu_before)(gpu_used_mib()),
                           "rss_bytes": tree_rss_bytes(proc.pid)}
        entry["requests"], entry["side_requests"], entry["side_alone"] = rows, sides, alone
        entry["summary"] = summarise(rows, sides, alone)
        s = entry["summary"]
        run.log(f"  {server}: main TTFT p50 {s['main_ttft_s_p50']}, side TTFT p50 {s['side_ttft_s']['p50']} "
                f"(alone {s['side_alone_ttft_s']['p50']}), memory {entry['memory']}")
    finally:
        entry["log_tail"] = proc.output_tail(25)
        entry["exit_code"] = proc.stop()
    return entry


def summarise(rows: list[dict], sides: list[dict], alone: list[dict]) -> dict[str, Any]:
    ok = [r for r in rows if r.get("ok")]
    main_p50, main_n = ttft_p50(ok, "main")
    side_ok = [r for r in sides if r.get("ok")]
    alone_ok = [r for r in alone if r.get("ok")]
    side_alone = percentiles([r["ttft_s"] for r in alone_ok if r.get("ttft_s") is not None])
    side = percentiles([r["ttft_s"] for r in side_ok if r.get("ttft_s") is not None])
    return {
        "requests": len(rows), "ok": len(ok), "side_requests": len(sides), "side_ok": len(side_ok),
        "errors": [f"{r['agent']} #{r['index']}: {r.get('error')}" for r in rows if not r.get("ok")][:5]
                  + [f"side #{r['index']}: {r.get('error')}" for r in sides if not r.get("ok")][:5],
        "main_ttft_s_p50": main_p50, "main_ttft_n": main_n,
        "title_ttft_s": [r.get("ttft_s") for r in ok if r["agent"] == "title"],
        "side_ttft_s": side, "side_total_s": percentiles([r["total_s"] for r in side_ok if r.get("total_s") is not None]),
        "side_alone_ttft_s": side_alone,
        "side_ttft_p95_over_alone_p50": (round(side["p95"] / side_alone["p50"], 3)
                                         if side["p95"] is not None and side_alone["p50"] else None),
    }


def workload_models(run: Run) -> dict[str, Any]:
    a = run.a
    if not a.mod_small:
        raise SystemExit("the models workload needs --mod-small (the small model's GGUF)")
    probe = UserSession(run.texts, 0, scale=a.mod_scale, gen_tokens=a.mod_gen_tokens, billing="cch", shapes="current")
    steps = session_schedule(a.mod_requests, probe.current)
    ctx = a.mod_ctx_size or context_for(probe, a.mod_requests, a.mod_gen_tokens, a.mod_np)
    folder = models_folder(run)
    out: dict[str, Any] = {"settings": {
        "big": a.model, "small": a.mod_small, "sessions": a.mod_sessions, "np": a.mod_np, "ctx": ctx,
        "requests": a.mod_requests, "scale": a.mod_scale, "gen_tokens": a.mod_gen_tokens,
        "side_tokens": a.mod_side_tokens, "side_alone": a.mod_side_alone,
        "schedule": [s.agent for s in steps]}, "servers": {}}
    run.result["workloads"]["models"] = out
    for server in a.servers:
        if server == LLAMA_SERVER and run.llama_server is None:
            out["servers"][server] = {"error": "llama-server not found (pass --llama-server)"}
            continue
        out["servers"][server] = one_server(run, server, folder, ctx)
        run.save()
    ws = (out["servers"].get(WARMSLOT) or {}).get("summary") or {}
    ls = (out["servers"].get(LLAMA_SERVER) or {}).get("summary") or {}
    out["comparison"] = {
        "main_ttft_s_p50": {WARMSLOT: ws.get("main_ttft_s_p50"), LLAMA_SERVER: ls.get("main_ttft_s_p50")},
        "main_ttft_ratio_warmslot_over_llama_server": bc.ratio(ws.get("main_ttft_s_p50"), ls.get("main_ttft_s_p50")),
        "side_ttft_p95_over_alone_p50": {WARMSLOT: ws.get("side_ttft_p95_over_alone_p50"),
                                         LLAMA_SERVER: ls.get("side_ttft_p95_over_alone_p50")},
    }
    shutil.rmtree(folder, ignore_errors=True)
    return out
