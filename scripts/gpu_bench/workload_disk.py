"""The `disk` workload: warmslot's disk tier across a restart, and its writes behind streams.

restart  -np 1, --cache-disk in a fresh directory under --disk-dir. An agent conversation
         grown to about --disk-tokens prompt tokens (system prompt, tools, recorded calls and
         tool results of --tool-tokens) is sent once; the server is stopped with SIGTERM (it
         writes the conversation on the way out: the shutdown time is recorded), the entry
         files are dropped from the page cache (posix_fadvise DONTNEED on the fsynced files)
         so the load reads the device, and a server with the same flags is started. The next
         turn (a recorded call and its tool result added) is sent: its TTFT, cached tokens and
         source, and the disk tier's bytes and seconds read (/metrics). The same prompt is then
         sent with `cache_prompt: false` on the same server: the cold prefill it is compared
         with. Targets: TTFT at most 0.15x the cold prefill's, and 2 GB/s or more read.
spills   -np 2 and --cache-ram --spill-ram, twice: without --cache-disk, then with it. One
         stream generates --spill-decode-tokens tokens (ignore_eos) while the other slot takes
         --spill-requests new conversations of --spill-tokens prompt tokens one after another:
         each one pushes the previous out of the slot into RAM and an older one out of RAM,
         which the disk run writes to disk (and the other run drops). The stream's tokens/s
         inside the window of those requests, disk run over no-disk run, must stay at 0.95x or
         more. The writer's bandwidth is the disk tier's bytes written over its write seconds.

warmslot only: llama-server has no tier below its RAM cache (its --slot-save-path needs the
client to save and restore by name).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from scripts import bench_common as bc
from scripts.bench_client import get_text
from scripts.page_cache import drop_page_cache

from . import WARMSLOT
from .agent import Agent
from .client import render_tokens, request_record, sampling_body, stream
from .servers import Run, Served, round_up

TTFT_TARGET = 0.15  # warm TTFT over cold prefill TTFT
READ_TARGET_GBPS = 2.0
DECODE_TARGET = 0.95  # decode tokens/s during spills over without the disk tier


def agent_conversation(run: Run, target_tokens: int, url: str) -> tuple[list[dict], list[dict] | None, list[dict], int]:
    """An agent session's messages grown until the server renders them to `target_tokens` or
    more (a recorded call and its tool result per turn), its tools, the next turn's two
    messages, and the rendered length."""
    a = run.a
    lo, hi = a.tool_tokens
    agent = Agent(run.texts, session="disk", system_tokens=min(a.system_tokens, target_tokens // 3), n_tools=a.n_tools,
                  tools_in=a.tools_in, tool_lo=lo, tool_hi=hi, turns=1000, task_seed="disk")
    tools = agent.request_tools()
    messages = agent.first_messages()
    turn, n = 1, 0

    def pair(turn: int) -> list[dict]:
        msg, call_id = agent.recorded_reply(turn)
        return [msg, {"role": "tool", "tool_call_id": call_id, "content": agent.tool_result(turn - 1)[0]}]

    while turn < agent.turns - 1:
        rendered = render_tokens(WARMSLOT, url, messages, tools, a.template_kwargs)
        n = len(rendered) if rendered else n + hi
        if n >= target_tokens:
            break
        messages += pair(turn)
        turn += 1
    return messages, tools, pair(turn), n


def filesystem_of(path: Path) -> dict[str, Any]:
    """The mount holding `path` (device, type): the restore must read a real disk, not tmpfs."""
    best: tuple[str, str, str] = ("", "", "")
    real = os.path.realpath(path)
    try:
        with open("/proc/mounts") as f:
            for line in f:
                dev, mnt, fstype = line.split()[:3]
                if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best[1]):
                    best = (dev, mnt, fstype)
    except OSError:
        pass
    usage = shutil.disk_usage(real)
    return {"device": best[0], "mount": best[1], "type": best[2], "free_bytes": usage.free}


def _metric(m: dict[str, float], name: str) -> float:
    return float(m.get(name, 0.0))


def disk_metrics(srv: Served) -> dict[str, float]:
    text = get_text(srv.url, "/metrics") or ""
    m = bc.parse_prometheus(text) if text else {}
    return {k: v for k, v in m.items() if k.startswith("warmslot_disk_cache") or k.startswith("warmslot_prompt_tokens_total")}


def workload_restart(run: Run, base: Path) -> dict[str, Any]:
    a = run.a
    directory = Path(tempfile.mkdtemp(prefix="restart-", dir=base)) / "cache"
    ctx = a.disk_ctx_size or round_up(a.disk_tokens + 2 * a.tool_tokens[1] + 2 * a.gen_tokens + 1024, 1024)
    extra = ["--cache-disk", str(directory), "--cache-disk-size", a.disk_size] + (["--cache-ram", a.disk_ram] if a.disk_ram else [])
    out: dict[str, Any] = {"settings": {"target_tokens": a.disk_tokens, "ctx": ctx, "np": 1, "flags": extra},
                           "filesystem": filesystem_of(directory.parent)}
    with Served(run, WARMSLOT, 1, ctx, "disk-first", extra) as srv:
        out["server_first"] = srv.info
        if not srv.ok:
            return out
        messages, tools, nxt, rendered = agent_conversation(run, a.disk_tokens, srv.url)
        body = {**sampling_body(a, a.gen_tokens), "messages": messages}
        if tools:
            body["tools"] = tools
        first = stream(srv.url, "/v1/chat/completions", body, timeout=run.timeout())
        out["first"] = request_record(first)
        run.log(f"  disk: first turn {first.get('prompt_tokens')} prompt tokens ({rendered} rendered), "
                f"TTFT {(first.get('ttft_s') or 0) * 1000:.0f} ms")
        t0 = time.perf_counter()
        srv.proc.stop(timeout=max(60.0, a.request_timeout))
        out["shutdown_s"] = time.perf_counter() - t0
        out["log_tail_first"] = srv.proc.output_tail(12)
        srv.proc = None
    files = sorted(p for p in directory.iterdir() if p.name.endswith(".wsc"))
    out["files"] = [{"name": p.name, "bytes": p.stat().st_size} for p in files]
    out["page_cache_dropped_bytes"] = drop_page_cache(directory)
    run.log(f"  disk: stopped in {out['shutdown_s']:.2f}s; {len(files)} entry files, "
            f"{sum(f['bytes'] for f in out['files']) / 1e9:.2f} GB, dropped from the page cache")
    with Served(run, WARMSLOT, 1, ctx, "disk-restarted", extra) as srv:
        out["server_restarted"] = srv.info
        if not srv.ok:
            return out
        before = disk_metrics(srv)
        body = {**sampling_body(a, a.gen_tokens), "messages": messages + nxt}
        if tools:
            body["tools"] = tools
        warm = stream(srv.url, "/v1/chat/completions", body, timeout=run.timeout())
        after = disk_metrics(srv)
        cold = stream(srv.url, "/v1/chat/completions", {**body, "cache_prompt": False}, timeout=run.timeout())
        out["warm"] = request_record(warm)
        out["cold"] = request_record(cold)
        out["metrics_before"], out["metrics_after"] = before, after
    read_bytes = _metric(after, "warmslot_disk_cache_read_bytes_total") - _metric(before, "warmslot_disk_cache_read_bytes_total")
    read_s = _metric(after, "warmslot_disk_cache_read_seconds_total") - _metric(before, "warmslot_disk_cache_read_seconds_total")
    warm_ttft, cold_ttft = warm.get("ttft_s"), cold.get("ttft_s")
    summary = {
        "prompt_tokens": warm.get("prompt_tokens"),
        "cached_tokens": warm.get("cached_tokens"),
        "source": (warm.get("cache_header") or "").split(";")[0].split("=")[-1].replace("Source.", "").lower() or None,
        "first_ttft_s": first.get("ttft_s"),
        "warm_ttft_s": warm_ttft,
        "cold_ttft_s": cold_ttft,
        "ttft_ratio": warm_ttft / cold_ttft if warm_ttft and cold_ttft else None,
        "read_bytes": read_bytes,
        "read_s": read_s,
        "read_gb_per_s": read_bytes / read_s / 1e9 if read_s > 0 else None,
        # the whole entry over the whole warm TTFT: what a client sees of the disk
        "effective_gb_per_s": read_bytes / warm_ttft / 1e9 if warm_ttft and read_bytes else None,
        "same_text_as_cold": bool(warm.get("ok") and cold.get("ok") and warm.get("content") == cold.get("content")),
    }
    summary["ttft_target_met"] = summary["ttft_ratio"] is not None and summary["ttft_ratio"] <= TTFT_TARGET
    summary["read_target_met"] = summary["read_gb_per_s"] is not None and summary["read_gb_per_s"] >= READ_TARGET_GBPS
    out["summary"] = summary
    run.log(f"  disk restart: next turn {summary['prompt_tokens']} tokens, {summary['cached_tokens']} cached "
            f"({summary['source']}); TTFT {(warm_ttft or 0) * 1000:.0f} ms vs cold {(cold_ttft or 0) * 1000:.0f} ms "
            f"= {summary['ttft_ratio'] or 0:.3f}x; read {read_bytes / 1e9:.2f} GB at {summary['read_gb_per_s'] or 0:.2f} GB/s")
    return out


def _rate_in_window(rec: dict[str, Any], start: float, end: float) -> dict[str, Any]:
    """A stream's tokens/s between two perf_counter instants, from its chunk arrival times."""
    times = [rec["t_start"] + t for t in rec.get("chunk_times") or []]
    inside = [t for t in times if start <= t <= end]
    if len(inside) < 3:
        return {"tokens": len(inside), "tokens_per_s": None}
    per_chunk = (rec.get("completion_tokens") or len(times)) / max(1, len(times))
    return {"tokens": len(inside), "tokens_per_s": (len(inside) - 1) * per_chunk / (inside[-1] - inside[0])}


def wait_for_decoding(srv: Served, finished: threading.Event, timeout: float = 120.0) -> None:
    """Until a slot generates (warmslot's /metrics), so the requests land on a decoding stream."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not finished.is_set():
        m = bc.parse_prometheus(get_text(srv.url, "/metrics") or "")
        if m.get("warmslot_slots{state=decode}", 0) >= 1:
            return
        time.sleep(0.05)


def spill_run(run: Run, base: Path, with_disk: bool) -> dict[str, Any]:
    a = run.a
    ctx = a.spill_ctx_size or round_up(2 * (a.spill_tokens + a.spill_decode_tokens + 512), 1024)
    extra = ["--cache-ram", a.spill_ram]
    if with_disk:
        extra += ["--cache-disk", str(Path(tempfile.mkdtemp(prefix="spill-", dir=base)) / "cache"), "--cache-disk-size", a.disk_size]
    label = "disk-spills" if with_disk else "disk-spills-baseline"
    res: dict[str, Any] = {"flags": extra, "ctx": ctx}
    with Served(run, WARMSLOT, 2, ctx, label, extra) as srv:
        res["server"] = srv.info
        if not srv.ok:
            return res
        prompts = [run.texts.text(("prose", "code", "log")[i % 3], f"spill-{i}", a.spill_tokens) for i in range(a.spill_requests)]
        streamer: dict[str, Any] = {}
        finished = threading.Event()

        def decode() -> None:
            body = {**sampling_body(a, a.spill_decode_tokens), "prompt": run.texts.text("prose", "spill-stream", 200)}
            streamer.update(stream(srv.url, "/v1/completions", body, timeout=run.timeout(), keep_chunk_times=True))
            finished.set()

        thread = threading.Thread(target=decode, daemon=True)
        before = disk_metrics(srv)
        thread.start()
        wait_for_decoding(srv, finished)
        requests = []
        for p in prompts:
            if finished.is_set():
                break
            r = stream(srv.url, "/v1/completions", {**sampling_body(a, 1), "prompt": p}, timeout=run.timeout())
            requests.append(r)
        window = (requests[0]["t_start"], requests[-1]["t_start"] + (requests[-1].get("total_s") or 0)) if requests else (0, 0)
        thread.join(run.timeout() + 5)
        after = disk_metrics(srv)
        res["stream"] = request_record(streamer) if streamer else {"ok": False, "error": "no result"}
        res["requests"] = [request_record(r) for r in requests]
        res["window_s"] = window[1] - window[0]
        res["stream_in_window"] = _rate_in_window(streamer, *window) if streamer.get("ok") else {"tokens_per_s": None}
        # the measured stream must outlast the requests, or the window holds less than their spills
        res["stream_covered_window"] = bool(streamer.get("ok") and streamer["t_start"] + streamer["total_s"] >= window[1])
        res["metrics_delta"] = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    d = res["metrics_delta"]
    res["writes"] = d.get("warmslot_disk_cache_writes_total", 0.0)
    res["write_bytes"] = d.get("warmslot_disk_cache_write_bytes_total", 0.0)
    ws = d.get("warmslot_disk_cache_write_seconds_total", 0.0)
    res["write_gb_per_s"] = res["write_bytes"] / ws / 1e9 if ws > 0 else None
    run.log(f"  {label}: stream {res['stream_in_window'].get('tokens_per_s') or 0:.1f} tok/s during "
            f"{len(res['requests'])} requests ({res['window_s']:.1f}s); {res['writes']:.0f} writes, "
            f"{res['write_bytes'] / 1e9:.2f} GB at {res['write_gb_per_s'] or 0:.2f} GB/s")
    return res


def workload_spills(run: Run, base: Path) -> dict[str, Any]:
    a = run.a
    out: dict[str, Any] = {"settings": {"spill_tokens": a.spill_tokens, "spill_requests": a.spill_requests,
                                        "decode_tokens": a.spill_decode_tokens, "cache_ram": a.spill_ram, "np": 2}}
    out["without_disk"] = spill_run(run, base, with_disk=False)
    out["with_disk"] = spill_run(run, base, with_disk=True)
    base_tps = out["without_disk"].get("stream_in_window", {}).get("tokens_per_s")
    disk_tps = out["with_disk"].get("stream_in_window", {}).get("tokens_per_s")
    ratio = disk_tps / base_tps if base_tps and disk_tps else None
    out["summary"] = {"decode_tps_without_disk": base_tps, "decode_tps_with_disk": disk_tps, "ratio": ratio,
                      "target_met": ratio is not None and ratio >= DECODE_TARGET,
                      "writes": out["with_disk"].get("writes"), "write_gb_per_s": out["with_disk"].get("write_gb_per_s"),
                      "stream_covered_window": out["with_disk"].get("stream_covered_window")}
    return out


def workload_disk(run: Run) -> dict[str, Any]:
    a = run.a
    if WARMSLOT not in a.servers:
        return {"skipped": "the disk workload runs on warmslot only"}
    base = Path(a.disk_dir or "build/disk-bench").resolve()
    base.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"settings": {"dir": str(base), "disk_size": a.disk_size}}
    try:
        out["restart"] = workload_restart(run, base)
        run.save()
        if not run.budget.spent():
            out["spills"] = workload_spills(run, base)
    finally:
        if not a.disk_keep:
            for p in base.iterdir():
                if p.name.startswith(("restart-", "spill-")):
                    shutil.rmtree(p, ignore_errors=True)
    return out


def add_disk_arguments(p) -> None:
    p.add_argument("--disk-tokens", type=int, default=30000, help="prompt tokens of the conversation restored after a restart")
    p.add_argument("--disk-ctx-size", type=int, default=0, help="-c of the restart runs (0: from --disk-tokens)")
    p.add_argument("--disk-dir", default=None, help="where the cache directories go (default build/disk-bench; a real disk, not tmpfs)")
    p.add_argument("--disk-size", default="64GiB", help="--cache-disk-size of every disk run")
    p.add_argument("--disk-ram", default=None, help="--cache-ram of the restart runs (default: warmslot's)")
    p.add_argument("--disk-keep", action="store_true", help="keep the cache directories after the run")
    p.add_argument("--spill-tokens", type=int, default=8000, help="prompt tokens of each conversation that spills")
    p.add_argument("--spill-requests", type=int, default=8, help="conversations sent while the stream decodes")
    p.add_argument("--spill-decode-tokens", type=int, default=2048, help="tokens the measured stream generates")
    p.add_argument("--spill-ram", default="1GiB", help="--cache-ram of the spill runs (small: every switch spills)")
    p.add_argument("--spill-ctx-size", type=int, default=0, help="-c of the spill runs (0: from the sizes)")
