"""The report's `throughput` section: generated tokens/s per -np and server (or variant), with
ratios to llama-server's default, warmslot's state counters, the plot, and the profile of
warmslot's engine thread when one was taken."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import LLAMA_SERVER, WARMSLOT
from .markdown import counters_table, fmt, ms, ratio, rx, table
from .plot import line_chart

PROFILE_ROWS = 15


def _runs(w: dict[str, Any]) -> list[tuple[str, int, dict[str, Any]]]:
    """(variant label, -np, run) for every run, -np ascending, variants in run order."""
    out = []
    for label, res in (w.get("servers") or {}).items():
        for np_, r in (res.get("runs") or {}).items():
            out.append((label, int(np_), r))
    return sorted(out, key=lambda t: t[1])


def _tokens_per_s(w: dict[str, Any], label: str, np_: int) -> float | None:
    r = (((w.get("servers") or {}).get(label) or {}).get("runs") or {}).get(str(np_)) or {}
    return (r.get("summary") or {}).get("tokens_per_s")


def rates_table(w: dict[str, Any]) -> str:
    rows = []
    for label, np_, r in _runs(w):
        s = r.get("summary") or {}
        status = f"{s.get('ok')}/{s.get('requests')}" if s else (r.get("skipped") or "server failed")
        vs = ratio(s.get("tokens_per_s"), _tokens_per_s(w, LLAMA_SERVER, np_)) if label != LLAMA_SERVER else None
        rows.append([np_, label + (" (profiled)" if r.get("profiled") else ""), status, fmt(s.get("tokens_per_s"), 1),
                     rx(vs), ms(s.get("ttft_s_p50")), ms(s.get("ttft_s_p95")), fmt(s.get("latency_s_p50"))])
    return table(["-np", "server", "requests", "generated tok/s", "vs llama-server", "TTFT p50 ms", "TTFT p95 ms",
                  "latency p50 s"], rows)


def warmslot_counters(w: dict[str, Any]) -> str:
    servers = w.get("servers") or {}
    columns = {f"{label} -np {np_}": r.get("counters_delta") or {} for label, np_, r in _runs(w)
               if (servers.get(label) or {}).get("name") == WARMSLOT and r.get("summary")}
    return counters_table(columns)


def profile_tables(w: dict[str, Any]) -> str:
    """Where the engine thread's time goes, from the py-spy profile of the profiled run."""
    for label, np_, r in _runs(w):
        note = r.get("profile")
        if not note:
            continue
        summary = note.get("summary") or {}
        if not summary.get("samples"):
            reason = note.get("skipped") or note.get("error") or summary.get("error") or "no engine-thread samples"
            return f"No profile of {label} at -np {np_}: {reason}."
        head = (f"Where the engine thread's time goes: py-spy, {label} at -np {np_}, {summary['samples']:,} samples "
                f"of the `{summary['thread']}` thread (idle time included; profile `{Path(note['file']).name}`). "
                "Sampling slows the profiled run a little.")
        if note.get("warning"):
            head += f" py-spy could not keep its rate (`{note['warning']}`): the shares are rougher."
        parts = [head]
        for key, title in (("self", "self (the innermost frame)"), ("cumulative", "cumulative (anywhere on the stack)")):
            rows = [[f"`{e['function']}`", e["samples"], f"{e['share'] * 100:.1f}%"]
                    for e in summary.get(key, [])[:PROFILE_ROWS]]
            parts.append(f"By {title}:\n\n" + table(["function", "samples", "share"], rows))
        return "\n\n".join(parts)
    return ""


def throughput_section(w: dict[str, Any]) -> str:
    st = w.get("settings") or {}
    text = (f"{st.get('clients')} clients drain a queue of {st.get('requests')} distinct `/v1/completions` requests "
            f"(about {st.get('prompt_tokens')} prompt tokens each, {st.get('gen_tokens')} generated with ignore_eos, "
            f"default sampling), -c {st.get('ctx')}, a fresh server per -np. Generated tok/s: all completion tokens "
            "over the first send to the last answer.\n\n" + rates_table(w))
    counters = warmslot_counters(w)
    if counters:
        text += "\n\nwarmslot's counters over each run:\n\n" + counters
    profile = profile_tables(w)
    if profile:
        text += "\n\n" + profile
    return text


def plot_throughput(w: dict[str, Any], stem: Path, title: str) -> Path | None:
    series: dict[str, list[tuple[float, float]]] = {}
    for label, np_, r in _runs(w):
        tps = (r.get("summary") or {}).get("tokens_per_s")
        if tps:
            series.setdefault(label, []).append((np_, tps))
    return line_chart(series, stem, f"{title}: throughput of distinct requests", "-np (slots)",
                      "generated tokens/s")
