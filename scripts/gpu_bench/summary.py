"""The console summary printed at the end of a run."""

from __future__ import annotations

from typing import Any

from scripts import bench_common as bc

from . import WARMSLOT


def print_summary(result: dict[str, Any]) -> None:
    w = result.get("workloads") or {}
    rows = []
    for server, res in ((w.get("agent") or {}).get("servers") or {}).items():
        for mode, m in (res.get("modes") or {}).items():
            s = m["summary"]
            rows.append([server, mode, s["turns_ok"], s["prompt_tokens_total"], s["computed_tokens_total"],
                         s["ideal_computed_total"], (s["ttft_s_p50_turn2plus"] or 0) * 1000, s["wall_s"],
                         s.get("wall_s_first_k")])
    if rows:
        print("\nagent replay")
        print(bc.format_table(["server", "mode", "turns", "prompt", "computed", "ideal", "TTFT p50 2+ ms",
                               "wall s", "wall first k"], rows))
    rows = []
    for server, res in ((w.get("alternating") or {}).get("servers") or {}).items():
        s = res.get("summary") or {}
        rows.append([server, s.get("ok"), (s.get("ttft_s_p50_first") or 0) * 1000,
                     (s.get("ttft_s_p50_returns") or 0) * 1000, s.get("computed_tokens_returns")])
    if rows:
        print("\nalternating")
        print(bc.format_table(["server", "requests", "TTFT p50 first ms", "TTFT p50 returns ms",
                               "computed on returns"], rows))
    rows = []
    for server, res in ((w.get("concurrent") or {}).get("servers") or {}).items():
        s = res.get("summary") or {}
        rows.append([server, s.get("ok"), res.get("wall_s"), s.get("generated_tokens_per_wall_s"),
                     s.get("decode_tps_per_request_p50"), (s.get("ttft_s_p50") or 0) * 1000,
                     (s.get("ttft_s_p95") or 0) * 1000])
    if rows:
        print("\nconcurrent")
        print(bc.format_table(["server", "requests", "wall s", "gen tok/wall s", "decode p50", "TTFT p50 ms",
                               "TTFT p95 ms"], rows))
    rows = []
    for server, res in ((w.get("decode") or {}).get("servers") or {}).items():
        for c, e in (res.get("contexts") or {}).items():
            many = next((v for k, v in e.items() if k.startswith("streams_") and k != "streams_1"), {})
            rows.append([server, c, (e.get("streams_1") or {}).get("decode_tps"), many.get("aggregate_tps"),
                         many.get("per_stream_decode_tps_p50")])
    if rows:
        print("\ndecode")
        print(bc.format_table(["server", "context", "1 stream tok/s", "N streams aggregate", "per stream"], rows))
    r = (w.get("restore") or {}).get("servers", {}).get(WARMSLOT)
    if r:
        print(f"\nrestore (warmslot): loaded {r.get('prompt_cache_loaded_bytes')} B in "
              f"{r.get('prompt_cache_load_seconds')} s = {r.get('load_gb_per_s')} GB/s; checkpoints restored "
              f"{r.get('checkpoints_restored')}")
    print_throughput(w.get("throughput") or {})
    print_multiagent(w.get("multiagent") or {})
    print_disk(w.get("disk") or {})
    print_messages(w.get("messages") or {})
    print_codex(w.get("codex") or {})
    print_sessions(w.get("sessions") or {})


def print_throughput(w: dict[str, Any]) -> None:
    rows = []
    for label, res in (w.get("servers") or {}).items():
        for np_, r in (res.get("runs") or {}).items():
            s = r.get("summary") or {}
            rows.append([label, np_, f"{s.get('ok')}/{s.get('requests')}" if s else r.get("skipped") or "error",
                         s.get("tokens_per_s"), (s.get("ttft_s_p50") or 0) * 1000, (s.get("ttft_s_p95") or 0) * 1000])
    if rows:
        print("\nthroughput")
        print(bc.format_table(["server", "np", "requests", "gen tok/s", "TTFT p50 ms", "TTFT p95 ms"], rows))


def print_multiagent(w: dict[str, Any]) -> None:
    rows = []
    for server, res in (w.get("servers") or {}).items():
        s = res.get("summary") or {}
        copies = (s.get("state_copy_bytes") or {}).get("total")
        rows.append([server, f"{s.get('ok')}/{s.get('requests')}" if s else res.get("skipped") or "error",
                     s.get("computed_tokens_total"), s.get("unique_tokens"), s.get("computed_over_ideal"),
                     s.get("wall_s"), s.get("latency_s_p50"), (s.get("ttft_s_p50") or 0) * 1000,
                     None if copies is None else round(copies / 1e6, 1), s.get("copy_bytes_over_computed_kv")])
    if rows:
        print("\nmultiagent")
        print(bc.format_table(["server", "requests", "computed tokens", "unique", "computed/unique", "wall s",
                               "latency p50 s", "TTFT p50 ms", "copies MB", "copies/KV computed"], rows))


def print_disk(w: dict[str, Any]) -> None:
    r = (w.get("restart") or {}).get("summary")
    if r:
        print(f"\ndisk restart (warmslot): next turn {r.get('prompt_tokens')} tokens, {r.get('cached_tokens')} cached "
              f"from {r.get('source')}; TTFT {(r.get('warm_ttft_s') or 0) * 1000:.0f} ms vs cold "
              f"{(r.get('cold_ttft_s') or 0) * 1000:.0f} ms = {r.get('ttft_ratio') or 0:.3f}x (target <= 0.15x: "
              f"{'met' if r.get('ttft_target_met') else 'NOT met'}); read {(r.get('read_bytes') or 0) / 1e9:.2f} GB at "
              f"{r.get('read_gb_per_s') or 0:.2f} GB/s (target >= 2: {'met' if r.get('read_target_met') else 'NOT met'}), "
              f"{r.get('effective_gb_per_s') or 0:.2f} GB/s over the whole TTFT; same text as cold: {r.get('same_text_as_cold')}")
    s = (w.get("spills") or {}).get("summary")
    if s:
        print(f"disk spills (warmslot): stream {s.get('decode_tps_with_disk') or 0:.1f} tok/s with the tier vs "
              f"{s.get('decode_tps_without_disk') or 0:.1f} without = {s.get('ratio') or 0:.3f}x (target >= 0.95: "
              f"{'met' if s.get('target_met') else 'NOT met'}); {s.get('writes') or 0:.0f} writes at "
              f"{s.get('write_gb_per_s') or 0:.2f} GB/s")


def print_messages(w: dict[str, Any]) -> None:
    rows = []
    for server, res in (w.get("servers") or {}).items():
        for label, r in (res.get("runs") or {}).items():
            s = r.get("summary") or {}
            rows.append([server, label, f"{s.get('ok')}/{s.get('requests')}" if s else r.get("skipped") or "error",
                         (s.get("main_ttft_s_first") or 0) * 1000, (s.get("main_ttft_s_p50") or 0) * 1000,
                         (s.get("sub_ttft_s_p50") or 0) * 1000,
                         " ".join(f"{(t or 0) * 1000:.0f}" for t in s.get("compaction_ttft_s") or []),
                         s.get("computed_tokens_total"), s.get("ideal_computed_total"),
                         " ".join(f"{k}:{v}" for k, v in (s.get("errors_by_agent") or {}).items() if v) or "-",
                         s.get("title_json_ok", "-")])
    if rows:
        print("\nmessages (Claude-Code-shaped session through /v1/messages)")
        print(bc.format_table(["server", "np", "requests", "main TTFT first ms", "main TTFT p50 ms", "sub TTFT p50 ms",
                               "compaction TTFT ms", "computed", "ideal", "errors", "title JSON"], rows))
    for label, c in (w.get("comparison") or {}).items():
        print(f"  {label}: main TTFT p50 warmslot / llama-server = {c.get('ttft_ratio_warmslot_over_llama_server')}; "
              f"warmslot computed {c.get('warmslot_computed')} vs ideal {c.get('warmslot_ideal')}")


def print_codex(w: dict[str, Any]) -> None:
    rows = []
    for server, res in (w.get("servers") or {}).items():
        s = res.get("summary") or {}
        rows.append([server, f"{s.get('ok')}/{s.get('requests')}" if s else res.get("skipped") or "error",
                     (s.get("ttft_s_first") or 0) * 1000, (s.get("ttft_s_p50") or 0) * 1000, s.get("ttft_fallbacks"),
                     s.get("computed_tokens_total"), s.get("ideal_computed_total"), s.get("encrypted_content_returned"),
                     s.get("errors"), " ".join(str(x) for x in s.get("statuses") or []) or "-"])
    if rows:
        print("\ncodex (Codex-shaped session through /v1/responses)")
        print(bc.format_table(["server", "requests", "TTFT first ms", "TTFT p50 ms", "TTFT fallbacks", "computed",
                               "ideal", "encrypted_content", "errors", "statuses"], rows))
    c = w.get("comparison") or {}
    if c:
        print(f"  TTFT p50 warmslot / llama-server = {c.get('ttft_ratio_warmslot_over_llama_server')}; "
              f"errors {c.get('errors')}")


def print_sessions(w: dict[str, Any]) -> None:
    rows = []
    for label in (w.get("settings") or {}).get("runs") or []:
        for server, res in (w.get("servers") or {}).items():
            r = (res.get("runs") or {}).get(label) or {}
            s = r.get("summary") or {}
            copies = (s.get("state_copy_bytes") or {}).get("total")
            rows.append([label, server, f"{s.get('ok')}/{s.get('requests')}" if s else r.get("skipped") or "error",
                         s.get("wall_s"), s.get("computed_tokens_total"), s.get("ideal_computed_total"),
                         s.get("computed_over_ideal"),
                         f"{(s.get('main_ttft_s_p50') or 0) * 1000:.0f} ({s.get('main_ttft_n')})" if s else None,
                         None if copies is None else round(copies / 1e6, 1), s.get("copy_bytes_over_computed_kv"),
                         " ".join(f"{k}:{v}" for k, v in (s.get("errors_by_agent") or {}).items() if v) or "-"])
    if rows:
        print("\nsessions (Claude-Code-shaped sessions at once, more than slots, through /v1/messages)")
        print(bc.format_table(["S:P", "server", "requests", "wall s", "computed", "ideal", "computed/ideal",
                               "main TTFT p50 ms (n)", "copies MB", "copies/KV computed", "errors"], rows))
    for label, c in (w.get("comparison") or {}).items():
        print(f"  {label}: wall warmslot / llama-server = {c.get('wall_ratio_warmslot_over_llama_server')}; main "
              f"TTFT p50 ratio {c.get('ttft_ratio_warmslot_over_llama_server')}; computed/ideal "
              f"{c.get('computed_over_ideal')}; warmslot copies / KV of computed "
              f"{c.get('warmslot_copy_bytes_over_computed_kv')}")
