#!/usr/bin/env python3
"""Turn bench_gpu.py result JSONs into docs/benchmarks/REPORT.md and PNG plots.

Usage:

    python scripts/bench_report.py RESULT.json [RESULT.json ...] [--out docs/benchmarks/REPORT.md]

Results are grouped by model (the `--shape` name given to bench_gpu.py, else the file name);
when several files hold the same workload for the same model, the most recent one wins (for
the sessions workload, per server and S:P, so its runs may come from several calls). The
report has, per model and workload, the two servers side by side with warmslot/llama-server
ratios, and a section that checks the targets. Plots go next to the report: TTFT per turn of
the agent replay (one panel per mode) and TTFT per request of the alternating workload
(matplotlib, if installed), and generated tokens/s against -np of the throughput workload
(a PNG with matplotlib, else an SVG). The throughput, multiagent and sessions sections are
in gpu_bench/report_throughput.py, gpu_bench/report_multiagent.py and
gpu_bench/report_sessions.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run as a file: the repo root makes the `scripts` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.gpu_bench.markdown import fmt, ms, ratio, rx, table, verdict  # noqa: E402
from scripts.gpu_bench.report_multiagent import multiagent_section  # noqa: E402
from scripts.gpu_bench.report_sessions import merge_sessions, sessions_section  # noqa: E402
from scripts.gpu_bench.report_throughput import plot_throughput, throughput_section  # noqa: E402

WARMSLOT = "warmslot"
LLAMA_SERVER = "llama-server"
REPO_ROOT = Path(__file__).resolve().parent.parent

TARGETS = [
    ("agent replay (dense)", "computed prompt tokens <= 1.02x ideal; p50 TTFT on turns 2+ <= 1.0x llama-server's"),
    ("agent replay (hybrid)", "wall <= 0.3x of no-cache; p50 TTFT <= 0.5x llama-server's"),
    ("alternating returns", "TTFT <= 0.1x llama-server's on hybrid, <= 0.3x on dense"),
    ("decode", ">= 0.97x llama-server's for 1 stream, >= 0.95x aggregate for 4"),
    ("restore", "RAM to GPU >= 10 GB/s effective"),
]

DEFINITIONS = """\
- **TTFT**: on the client, from sending the request to the first streamed chunk that carries
  generated text, reasoning or a tool-call delta. llama-server's own `timings.prompt_ms` is in
  the JSON too.
- **computed tokens**: prompt tokens the server evaluated for a request: llama-server's
  `timings.prompt_n`; for warmslot `usage.prompt_tokens - usage.prompt_tokens_details.cached_tokens`.
- **ideal computed tokens**: the tokens of each turn that no server could have had already.
  With T_t the token ids of turn t's prompt as the server renders it (warmslot's `/tokenize` with
  `messages`; llama-server's `/apply-template` then `/tokenize`) and G_t the tokens it generated
  (the streamed text re-tokenized; only in echo mode, since rerender replaces them):
  ideal_1 = |T_1| and ideal_t = |T_t| - LCP(T_t, T_{t-1} ++ G_{t-1}) for t >= 2, where LCP is the
  length of the longest common prefix. A server that reuses everything it has seen computes
  exactly the ideal; on models whose memory cannot be cut back (hybrid, recurrent, sliding
  window) reaching it needs a saved state at the divergence point.
- **wall**: the sum of the requests' client-side times (send to end of stream) over a replay;
  "vs no-cache" compares the first k turns of a replay with the no-cache baseline's k turns
  (k = `--nocache-turns`). The baseline is warmslot's own (`--cache-ram 0` and
  `cache_prompt: false`) when warmslot honours `cache_prompt`, else llama-server's.
- **returns** (alternating): every request after the first three, i.e. a conversation that
  comes back to the one slot after the two others used it.
- **decode aggregate**: tokens per second of all streams together while all of them were
  generating (client-side chunk times; "span" when that window was too short).
"""


# -- loading ---------------------------------------------------------------------------------


def load(paths: list[str]) -> dict[str, dict[str, Any]]:
    """{model: {"runs": [result, ...], "workloads": {name: (workload, result)}}}, newest wins."""
    models: dict[str, dict[str, Any]] = {}
    results = []
    for p in paths:
        try:
            r = json.loads(Path(p).read_text())
        except (OSError, ValueError) as exc:
            print(f"skipping {p}: {exc}", file=sys.stderr)
            continue
        r["_path"] = str(p)
        results.append(r)
    results.sort(key=lambda r: r.get("finished") or r.get("started") or "")
    for r in results:
        model = r.get("model") or {}
        name = model.get("shape") or model.get("name") or "model"
        entry = models.setdefault(name, {"runs": [], "workloads": {}})
        entry["runs"].append(r)
        for wname, w in (r.get("workloads") or {}).items():
            if isinstance(w, dict) and w.get("servers"):
                if wname == "sessions" and wname in entry["workloads"]:  # its runs may be split over calls
                    w = merge_sessions(entry["workloads"][wname][0], w)
                entry["workloads"][wname] = (w, r)
    return models


def memory_kind(entry: dict[str, Any], name: str) -> str:
    """dense, hybrid or swa: from warmslot's /v1/models meta, else from the shape name."""
    for r in reversed(entry["runs"]):
        meta = (r.get("model") or {}).get("meta") or {}
        mem = meta.get("memory")
        if mem == "attention":
            return "dense"
        if mem in ("hybrid", "recurrent"):
            return "hybrid"
        if mem == "swa":
            return "swa"
    if "qwen35" in name or "qwen3.5" in name:
        return "hybrid"
    if "gemma3" in name:
        return "swa"
    return "dense"


# -- per workload ----------------------------------------------------------------------------


def agent_section(w: dict[str, Any], kind: str) -> tuple[str, dict[str, Any]]:
    servers = w.get("servers") or {}
    lines = []
    rows = []
    figures: dict[str, Any] = {}
    nocache = {}
    for server in (LLAMA_SERVER, WARMSLOT):
        modes = (servers.get(server) or {}).get("modes") or {}
        if "nocache" in modes:
            nocache[server] = modes["nocache"]["summary"]
    baseline_server = WARMSLOT if WARMSLOT in nocache else LLAMA_SERVER if LLAMA_SERVER in nocache else None
    baseline = nocache.get(baseline_server) if baseline_server else None
    for mode in ("echo", "rerender", "nocache"):
        for server in (LLAMA_SERVER, WARMSLOT):
            m = ((servers.get(server) or {}).get("modes") or {}).get(mode)
            if not m:
                continue
            s = m["summary"]
            vs = None
            if mode != "nocache" and baseline and s.get("wall_s_first_k") is not None:
                vs = ratio(s["wall_s_first_k"], baseline.get("wall_s"))
            rows.append([mode, server, f"{s['turns_ok']}/{s['turns']}", s.get("last_prompt_tokens"),
                         s.get("prompt_tokens_total"), s.get("computed_tokens_total"), s.get("ideal_computed_total"),
                         rx(s.get("computed_over_ideal")), ms(s.get("ttft_s_turn1")),
                         ms(s.get("ttft_s_p50_turn2plus")), ms(s.get("ttft_s_p95_turn2plus")),
                         fmt(s.get("decode_tps_p50"), 1), fmt(s.get("wall_s")),
                         f"{fmt(s.get('wall_s_first_k'))} (k={s.get('first_k')})" if s.get("first_k") else "-",
                         rx(vs)])
    lines.append(table(["mode", "server", "turns", "last prompt", "prompt tokens", "computed", "ideal",
                        "computed/ideal", "TTFT turn 1 ms", "TTFT p50 2+ ms", "TTFT p95 2+ ms", "decode tok/s",
                        "wall s", "wall first k s", "wall vs no-cache"], rows))
    for mode in ("echo", "rerender", "nocache"):
        for server in (LLAMA_SERVER, WARMSLOT):
            m = ((servers.get(server) or {}).get("modes") or {}).get(mode)
            if m and m["summary"].get("stopped"):
                lines.append(f"\n{server} {mode} stopped early: {m['summary']['stopped']}.")
    firsts = {}
    for server in (LLAMA_SERVER, WARMSLOT):
        m = ((servers.get(server) or {}).get("modes") or {}).get("rerender") or {}
        t1 = next((t for t in m.get("turns") or [] if t.get("turn") == 1 and t.get("prompt_tokens")), None)
        if t1:
            firsts[server] = t1["prompt_tokens"]
    if len(firsts) == 2 and abs(firsts[WARMSLOT] - firsts[LLAMA_SERVER]) > 0.02 * max(firsts.values()):
        lines.append(f"\n**Warning:** the first prompt has {firsts[LLAMA_SERVER]:,} tokens on llama-server and "
                     f"{firsts[WARMSLOT]:,} on warmslot: the servers rendered different prompts (for example a chat "
                     "template without tool support, whose `tools` llama-server leaves out and warmslot injects), "
                     "so these rows are not comparable.")
    warning = ((servers.get(LLAMA_SERVER) or {}).get("server") or {}).get("warning")
    if warning:
        lines.append(f"\nllama-server: {warning}.")
    if baseline_server:
        lines.append(f"\nNo-cache baseline: {baseline_server}'s "
                     f"({baseline.get('turns_ok')} turns, {fmt(baseline.get('wall_s'))} s).")
    for server in (LLAMA_SERVER, WARMSLOT):
        note = (servers.get(server) or {}).get("nocache_note")
        if note:
            lines.append(f"\n{server}: {note}.")
    ratios = []
    for mode in ("echo", "rerender"):
        ws = (((servers.get(WARMSLOT) or {}).get("modes") or {}).get(mode) or {}).get("summary")
        ls = (((servers.get(LLAMA_SERVER) or {}).get("modes") or {}).get(mode) or {}).get("summary")
        if ws and ls:
            ratios.append([mode, rx(ratio(ws.get("ttft_s_p50_turn2plus"), ls.get("ttft_s_p50_turn2plus"))),
                           rx(ratio(ws.get("computed_tokens_total"), ls.get("computed_tokens_total"))),
                           rx(ratio(ws.get("wall_s"), ls.get("wall_s")))])
            figures[mode] = {"ws": ws, "ls": ls}
    if ratios:
        lines.append("\nwarmslot / llama-server:\n")
        lines.append(table(["mode", "TTFT p50 turns 2+", "computed tokens", "wall"], ratios))
    return "\n".join(lines), {"baseline": baseline, "baseline_server": baseline_server}


def agent_targets(w: dict[str, Any] | None, kind: str, extra: dict[str, Any]) -> list[list[str]]:
    if not w:
        return []
    servers = w.get("servers") or {}
    wmodes = (servers.get(WARMSLOT) or {}).get("modes") or {}
    lmodes = (servers.get(LLAMA_SERVER) or {}).get("modes") or {}
    rows = []
    for mode in ("echo", "rerender"):
        ws = (wmodes.get(mode) or {}).get("summary")
        ls = (lmodes.get(mode) or {}).get("summary")
        if not ws:
            continue
        ttft_r = ratio(ws.get("ttft_s_p50_turn2plus"), (ls or {}).get("ttft_s_p50_turn2plus"))
        if kind == "hybrid":
            base = extra.get("baseline")
            wall_r = ratio(ws.get("wall_s_first_k"), (base or {}).get("wall_s")) if base else None
            rows.append([f"agent replay (hybrid), {mode}", "wall <= 0.3x no-cache",
                         f"{rx(wall_r)} (first {ws.get('first_k')} turns, baseline {extra.get('baseline_server')})",
                         verdict(None if wall_r is None else wall_r <= 0.3)])
            rows.append([f"agent replay (hybrid), {mode}", "p50 TTFT <= 0.5x llama-server", rx(ttft_r),
                         verdict(None if ttft_r is None else ttft_r <= 0.5)])
        else:
            c = ws.get("computed_over_ideal")
            rows.append([f"agent replay ({kind}), {mode}", "computed <= 1.02x ideal",
                         f"{rx(c)} ({fmt(ws.get('computed_tokens_total'))} / {fmt(ws.get('ideal_computed_total'))})",
                         verdict(None if c is None else c <= 1.02)])
            rows.append([f"agent replay ({kind}), {mode}", "p50 TTFT turns 2+ <= 1.0x llama-server", rx(ttft_r),
                         verdict(None if ttft_r is None else ttft_r <= 1.0)])
    return rows


def alternating_section(w: dict[str, Any]) -> tuple[str, float | None]:
    servers = w.get("servers") or {}
    rows = []
    for server in (LLAMA_SERVER, WARMSLOT):
        res = servers.get(server) or {}
        s = res.get("summary") or {}
        if not s and not res.get("server", {}).get("error"):
            continue
        rows.append([server, s.get("ok"), ms(s.get("ttft_s_p50_first")), ms(s.get("ttft_s_p50_returns")),
                     s.get("prompt_tokens_returns"), s.get("cached_tokens_returns"), s.get("computed_tokens_returns"),
                     fmt(res.get("wall_s"))])
    ws = (servers.get(WARMSLOT) or {}).get("summary") or {}
    ls = (servers.get(LLAMA_SERVER) or {}).get("summary") or {}
    r = ratio(ws.get("ttft_s_p50_returns"), ls.get("ttft_s_p50_returns"))
    text = table(["server", "requests", "TTFT p50 first 3 ms", "TTFT p50 returns ms", "prompt tokens (returns)",
                  "cached (returns)", "computed (returns)", "wall s"], rows)
    text += f"\n\nwarmslot / llama-server TTFT on returns (p50): {rx(r)}"
    per = []
    wreq = (servers.get(WARMSLOT) or {}).get("requests") or []
    lreq = (servers.get(LLAMA_SERVER) or {}).get("requests") or []
    for i in range(max(len(wreq), len(lreq))):
        lw = wreq[i] if i < len(wreq) else {}
        ll = lreq[i] if i < len(lreq) else {}
        ref = lw or ll
        per.append([f"{ref.get('round')}{ref.get('conversation')}", "yes" if ref.get("return") else "",
                    ll.get("prompt_tokens"), ll.get("cached_tokens"), ms(ll.get("ttft_s")),
                    lw.get("prompt_tokens"), lw.get("cached_tokens"), ms(lw.get("ttft_s"))])
    if per:
        text += "\n\n<details><summary>every request</summary>\n\n"
        text += table(["request", "return", "llama-server prompt", "llama-server cached", "llama-server TTFT ms",
                       "warmslot prompt", "warmslot cached", "warmslot TTFT ms"], per)
        text += "\n\n</details>"
    return text, r


def concurrent_section(w: dict[str, Any]) -> str:
    servers = w.get("servers") or {}
    settings = w.get("settings") or {}
    rows = []
    for server in (LLAMA_SERVER, WARMSLOT):
        res = servers.get(server) or {}
        s = res.get("summary") or {}
        if not s:
            continue
        rows.append([server, f"{s.get('ok')}/{s.get('requests')}", fmt(res.get("wall_s")),
                     fmt(s.get("generated_tokens_per_wall_s"), 1), fmt(s.get("decode_tps_per_request_p50"), 1),
                     fmt(s.get("decode_tps_sum_of_client_p50"), 1), ms(s.get("ttft_s_p50")), ms(s.get("ttft_s_p95")),
                     s.get("prompt_tokens_total"), s.get("computed_tokens_total")])
    ws = (servers.get(WARMSLOT) or {}).get("summary") or {}
    ls = (servers.get(LLAMA_SERVER) or {}).get("summary") or {}
    text = (f"{settings.get('clients')} clients x {settings.get('turns')} requests, system prompt "
            f"{settings.get('system_tokens')} tokens ({'shared' if settings.get('shared_system_prompt') else 'distinct'}),"
            f" -np {settings.get('np')}, -c {settings.get('ctx')}.\n\n")
    text += table(["server", "requests", "wall s", "generated tok / wall s", "decode tok/s per stream (p50)",
                   "sum of streams' p50", "TTFT p50 ms", "TTFT p95 ms", "prompt tokens", "computed"], rows)
    text += (f"\n\nwarmslot / llama-server: wall {rx(ratio(_wall(servers, WARMSLOT), _wall(servers, LLAMA_SERVER)))}, "
             f"TTFT p50 {rx(ratio(ws.get('ttft_s_p50'), ls.get('ttft_s_p50')))}, "
             f"TTFT p95 {rx(ratio(ws.get('ttft_s_p95'), ls.get('ttft_s_p95')))}, per-stream decode "
             f"{rx(ratio(ws.get('decode_tps_per_request_p50'), ls.get('decode_tps_per_request_p50')))}")
    return text


def _wall(servers: dict, name: str) -> float | None:
    return (servers.get(name) or {}).get("wall_s")


def decode_section(w: dict[str, Any]) -> tuple[str, list[tuple[str, float | None, float | None]]]:
    servers = w.get("servers") or {}
    settings = w.get("settings") or {}
    n = settings.get("streams", 4)
    contexts = sorted({c for s in servers.values() for c in (s.get("contexts") or {})}, key=int)
    rows = []
    checks = []
    for c in contexts:
        vals = {}
        for server in (LLAMA_SERVER, WARMSLOT):
            e = ((servers.get(server) or {}).get("contexts") or {}).get(c) or {}
            one = e.get("streams_1") or {}
            many = e.get(f"streams_{n}") or {}
            vals[server] = (one.get("decode_tps"), many.get("aggregate_tps"))
            srv_one = one.get("server_predicted_per_second")
            srv_many = many.get("server_predicted_per_second") or []
            engine = many.get("server_engine_aggregate_tps")
            server_side = (f"{fmt(srv_one, 1)} / {fmt(sum(x for x in srv_many if x), 1)}"
                           if srv_one is not None else (f"engine {fmt(engine, 1)}" if engine else "-"))
            rows.append([c, server, fmt(one.get("decode_tps"), 1), fmt(many.get("aggregate_tps"), 1),
                         many.get("aggregate_method") or "-", fmt(many.get("per_stream_decode_tps_p50"), 1),
                         server_side])
        r1 = ratio(vals.get(WARMSLOT, (None, None))[0], vals.get(LLAMA_SERVER, (None, None))[0])
        rn = ratio(vals.get(WARMSLOT, (None, None))[1], vals.get(LLAMA_SERVER, (None, None))[1])
        rows.append([c, "**warmslot / llama-server**", rx(r1), rx(rn), "", "", ""])
        checks.append((c, r1, rn))
    text = (f"{settings.get('decode_tokens')} generated tokens (ignore_eos) after a prompt of each length, "
            f"1 stream and {n} concurrent streams, -np {settings.get('np')}, -c {settings.get('ctx')}.\n\n")
    text += table(["context", "server", "1 stream tok/s", f"{n} streams aggregate tok/s", "method",
                   f"{n} streams per-stream p50", "server-side (1 / sum of streams)"], rows)
    return text, checks


def restore_section(w: dict[str, Any]) -> tuple[str, float | None]:
    servers = w.get("servers") or {}
    ws = servers.get(WARMSLOT) or {}
    rows = [[k, fmt(ws.get(k))] for k in (
        "prompt_cache_loaded_bytes", "prompt_cache_load_seconds", "load_gb_per_s", "prompt_cache_saved_bytes",
        "prompt_cache_save_seconds", "save_gb_per_s", "prompt_cache_hits", "prompt_cache_misses",
        "checkpoints_created", "checkpoints_restored", "logits_reused", "checkpoint_bytes_held",
        "prompt_cache_bytes_held")]
    text = "warmslot, after the alternating workload (/metrics and /slots):\n\n" + table(["figure", "value"], rows)
    if ws and not ws.get("prompt_cache_loaded_bytes"):
        text += ("\n\nNothing was loaded from the prompt cache: every request was served from the slot's own "
                 "contents and checkpoints (or computed), so there is no RAM-to-device rate to report.")
    src = ws.get("prompt_tokens_by_source")
    if src:
        text += "\n\nPrompt tokens by source: " + ", ".join(f"{k} {fmt(v)}" for k, v in src.items())
    ls = servers.get(LLAMA_SERVER) or {}
    if ls.get("metrics"):
        text += "\n\nllama-server's counters: " + ", ".join(
            f"`{k}` {fmt(v)}" for k, v in ls["metrics"].items()
            if k.endswith("_total") and ("prompt" in k or "predicted" in k) and "spec_decode" not in k)
    return text, ws.get("load_gb_per_s")


# -- plots -----------------------------------------------------------------------------------


def _pyplot():
    """matplotlib's pyplot drawing to files, or None where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def _ttft_axes(ax, xlabel: str) -> None:
    """Integer x, log TTFT y, a grid and the legend: how both TTFT plots look."""
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("TTFT (ms)")
    ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


def _save(plt, fig, path: Path) -> bool:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_agent(w: dict[str, Any], path: Path, title: str) -> bool:
    plt = _pyplot()
    if plt is None:
        return False
    servers = w.get("servers") or {}
    modes = [m for m in ("echo", "rerender", "nocache")
             if any(m in ((servers.get(s) or {}).get("modes") or {}) for s in servers)]
    if not modes:
        return False
    fig, axes = plt.subplots(1, len(modes), figsize=(5 * len(modes), 3.6), squeeze=False)
    for ax, mode in zip(axes[0], modes):
        for server, style in ((LLAMA_SERVER, "o-"), (WARMSLOT, "s-")):
            m = ((servers.get(server) or {}).get("modes") or {}).get(mode)
            if not m:
                continue
            turns = [t for t in m["turns"] if t.get("ok") and t.get("ttft_s") is not None]
            ax.plot([t["turn"] for t in turns], [t["ttft_s"] * 1000 for t in turns], style, ms=3, label=server)
        ax.set_title(f"{mode}")
        _ttft_axes(ax, "turn")
    fig.suptitle(f"{title}: agent replay, TTFT per turn")
    return _save(plt, fig, path)


def plot_alternating(w: dict[str, Any], path: Path, title: str) -> bool:
    plt = _pyplot()
    if plt is None:
        return False
    servers = w.get("servers") or {}
    fig, ax = plt.subplots(figsize=(8, 3.6))
    drawn = False
    for server, style in ((LLAMA_SERVER, "o-"), (WARMSLOT, "s-")):
        reqs = [r for r in (servers.get(server) or {}).get("requests") or [] if r.get("ok")]
        if not reqs:
            continue
        xs = list(range(1, len(reqs) + 1))
        ax.plot(xs, [r["ttft_s"] * 1000 for r in reqs], style, ms=3, label=server)
        drawn = True
    if not drawn:
        plt.close(fig)
        return False
    ax.axvline(3.5, color="grey", lw=0.8, ls="--")
    ax.text(3.6, ax.get_ylim()[1], "returns ->", va="top", fontsize=8, color="grey")
    _ttft_axes(ax, "request (A, B, C, A, B, C, ...)")
    ax.set_title(f"{title}: alternating conversations on one slot, TTFT per request")
    return _save(plt, fig, path)


# -- the report ------------------------------------------------------------------------------


def setup_lines(entry: dict[str, Any]) -> list[str]:
    r = entry["runs"][-1]
    machine = r.get("machine") or {}
    gpus = ", ".join(f"{g.get('name')} ({g.get('memory')})" for g in machine.get("gpus") or []) or "none (CPU)"
    ls = r.get("llama_server") or {}
    lcp = r.get("llama_cpp_python") or {}
    wg = machine.get("warmslot_git") or {}
    model = r.get("model") or {}
    meta = model.get("meta") or {}
    st = r.get("settings") or {}
    kvu = st.get("llama_server_kvu", st.get("kv_unified", False))  # older results: kv_unified, on by default
    flags = (f"-c {st.get('ctx_size')} -fa {st.get('flash_attn')} -ctk {st.get('cache_type_k')} "
             f"-ctv {st.get('cache_type_v')} -b {st.get('batch_size')} -ub {st.get('ubatch_size')} "
             f"-ngl {st.get('n_gpu_layers')}" + (f" -t {st.get('threads')}" if st.get("threads") else ""))
    return [
        f"- device: {gpus}; CPU {machine.get('cpu_model')} ({machine.get('usable_cpus')} usable)",
        (f"- model: `{model.get('name')}` ({fmt(model.get('mib'))} MiB; arch {meta.get('arch', '-')}, "
        f"{fmt(meta.get('n_params'))} parameters, memory {meta.get('memory', '-')})"),
        f"- llama-server: {ls.get('version', '-')} (commit {ls.get('commit_short') or ls.get('llama_cpp_commit') or '-'})"
        f"; warmslot's llama-cpp-python {lcp.get('version', '-')}"
        + (f" (llama.cpp {lcp['llama_cpp_commit'][:7]})" if lcp.get("llama_cpp_commit") else ""),
        f"- warmslot commit: {(wg.get('commit') or '-')[:12]}{' (with local changes)' if wg.get('dirty') else ''}",
        (f"- flags for both: `{flags}`; llama-server adds `--jinja --metrics --slots`"
         f"{' (and `-kvu` with -np > 1)' if kvu else ' (no `-kvu`: with -np > 1 each slot gets ctx/np)'}; "
        f"chat template: {st.get('chat_template_file') or 'the GGUF one'}"),
        f"- results: {', '.join('`' + Path(x['_path']).name + '`' for x in entry['runs'])}",
    ]


def server_starts(res: Any) -> list[tuple[str, dict[str, Any]]]:
    """(where, server info) of every server start a workload recorded for one server: its
    `server` and `server_nocache`, or one per run (-np) of the throughput workload."""
    if not isinstance(res, dict):
        return []
    found = [("", res.get(k)) for k in ("server", "server_nocache")]
    found += [(f" -np {np_}", r.get("server")) for np_, r in (res.get("runs") or {}).items() if isinstance(r, dict)]
    return [(where, info) for where, info in found if isinstance(info, dict)]


def build_report(models: dict[str, dict[str, Any]], out_dir: Path, plots: bool) -> str:
    parts = ["# warmslot vs llama-server on GPU", "",
             ("Generated by `scripts/bench_report.py` from `scripts/bench_gpu.py` results. Both servers ran the "
             "same model file, context, slots, KV types, batch sizes and flash-attention setting, one at a time; "
             "llama-server with its default prompt caching (`--cache-ram`, `--ctx-checkpoints`), warmslot with "
             "its defaults."), ""]
    target_rows: list[list[str]] = []
    body: list[str] = []
    for name, entry in models.items():
        kind = memory_kind(entry, name)
        wl = entry["workloads"]
        first_row = len(target_rows)
        body += [f"## {name} ({kind})", ""] + setup_lines(entry) + [""]
        if "agent" in wl:
            w, _ = wl["agent"]
            st = w.get("settings") or {}
            text, extra = agent_section(w, kind)
            body += ["### Agent replay", "",
                     (f"System prompt about {st.get('system_tokens')} tokens with {st.get('n_tools')} tools "
                     f"({st.get('tools_in')}), {st.get('turns')} requests of {st.get('gen_tokens')} generated tokens, "
                     f"tool results of {st.get('tool_tokens')} tokens, -np 1, -c {st.get('ctx')}."), "", text, ""]
            target_rows += agent_targets(w, kind, extra)
            if plots:
                png = out_dir / f"{name}-agent-ttft.png"
                if plot_agent(w, png, name):
                    body += [f"![agent replay TTFT per turn]({png.name})", ""]
        if "alternating" in wl:
            w, _ = wl["alternating"]
            st = w.get("settings") or {}
            text, r = alternating_section(w)
            body += ["### Alternating conversations", "",
                     (f"A, B, C share a {st.get('shared_tokens')}-token prefix and add {st.get('own_tokens')} tokens "
                     f"each; {st.get('rounds')} rounds of A, B, C on one slot (-np 1)."), "", text, ""]
            limit = 0.1 if kind == "hybrid" else 0.3
            target_rows.append([f"alternating returns ({kind})", f"TTFT <= {limit}x llama-server", rx(r),
                                verdict(None if r is None else r <= limit)])
            if plots:
                png = out_dir / f"{name}-alternating-ttft.png"
                if plot_alternating(w, png, name):
                    body += [f"![alternating TTFT per request]({png.name})", ""]
        if "concurrent" in wl:
            w, _ = wl["concurrent"]
            body += ["### Concurrent agents", "", concurrent_section(w), ""]
        if "decode" in wl:
            w, _ = wl["decode"]
            text, checks = decode_section(w)
            body += ["### Decode throughput", "", text, ""]
            for c, r1, rn in checks:
                target_rows.append([f"decode, context {c}", ">= 0.97x (1 stream)", rx(r1),
                                    verdict(None if r1 is None else r1 >= 0.97)])
                target_rows.append([f"decode, context {c}", ">= 0.95x (aggregate, 4 streams)", rx(rn),
                                    verdict(None if rn is None else rn >= 0.95)])
        if "restore" in wl:
            w, _ = wl["restore"]
            text, gbs = restore_section(w)
            body += ["### Restore", "", text, ""]
            target_rows.append(["restore", "RAM to GPU >= 10 GB/s", "-" if gbs is None else f"{gbs:.1f} GB/s",
                                verdict(None if gbs is None else gbs >= 10)])
        if "throughput" in wl:
            w, _ = wl["throughput"]
            body += ["### Throughput of distinct requests", "", throughput_section(w), ""]
            if plots:
                drawn = plot_throughput(w, out_dir / f"{name}-throughput", name)
                if drawn:
                    body += [f"![generated tokens/s against -np]({drawn.name})", ""]
        if "multiagent" in wl:
            w, _ = wl["multiagent"]
            body += ["### Agents sharing slots", "", multiagent_section(w), ""]
        if "sessions" in wl:
            w, _ = wl["sessions"]
            body += ["### Claude Code sessions sharing slots", "", sessions_section(w), ""]
        errors = [e for r in entry["runs"] for e in r.get("errors") or []]
        server_errors = []
        for wname, (w, _) in wl.items():
            for server, res in (w.get("servers") or {}).items():
                for where, info in server_starts(res):
                    err = info.get("error")
                    if err:
                        lines = [ln.strip() for ln in err.splitlines() if ln.strip()]
                        text = lines[0][:300] + (f" ... {lines[-1][:300]}" if len(lines) > 1 else "")
                        server_errors.append(f"{wname} / {server}{where}: {text}")
        if errors or server_errors:
            body += ["### Errors", ""]
            body += [f"- {e['workload']}: {e['error'][:300]}" for e in errors]
            body += [f"- {e}" for e in server_errors]
            body.append("")
        # model name prefixes the target rows of this model
        for row in target_rows[first_row:]:
            row[0] = f"{name}: {row[0]}"
    parts += ["## Targets", "", table(["target", "goal"], [[a, b] for a, b in TARGETS]), "",
              "Where they stand:", "", table(["model: workload", "check", "measured (warmslot)", "result"],
                                             target_rows) if target_rows else "No results yet.", "",
              "## Definitions", "", DEFINITIONS, ""]
    return "\n".join(parts + body)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="+", help="bench_gpu.py result JSONs")
    p.add_argument("--out", default=str(REPO_ROOT / "docs" / "benchmarks" / "REPORT.md"))
    p.add_argument("--no-plots", dest="plots", action="store_false")
    a = p.parse_args(argv)
    models = load(a.results)
    if not models:
        print("no results", file=sys.stderr)
        return 1
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(build_report(models, out.parent, a.plots))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
