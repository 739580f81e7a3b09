"""The `decode` workload: generation speed of one stream and of N concurrent streams after
prompts of several lengths."""

from __future__ import annotations

import threading
from typing import Any

from scripts import bench_common as bc

from .client import request_record, sampling_body, stream
from .servers import Run, Served, round_up


def decode_window(results: list[dict], min_window_s: float = 0.5, min_chunks: int = 8) -> dict[str, Any]:
    """Aggregate decode rate of concurrent streams, from the client's chunk arrival times.

    "window": from the latest first token to the earliest last token, while every stream was
    generating, counting each stream's chunks inside it (scaled to tokens); used when the window
    lasts at least `min_window_s` and holds `min_chunks` chunks per stream. Otherwise "span":
    all tokens after each stream's first, over the earliest first token to the latest last token.
    """
    ok = [r for r in results if r.get("ok") and r.get("chunk_times")]
    if len(ok) != len(results) or not ok:
        return {"method": None, "window_s": None, "aggregate_tps": None}
    start = max(r["chunk_times"][0] for r in ok)
    end = min(r["chunk_times"][-1] for r in ok)
    if end - start >= min_window_s:
        tokens = 0.0
        counts = []
        for r in ok:
            inside = sum(1 for t in r["chunk_times"] if start < t <= end)
            counts.append(inside)
            tokens += inside * (r["completion_tokens"] or r["token_chunks"]) / max(1, r["token_chunks"])
        if min(counts) >= min_chunks:
            return {"method": "window", "window_s": end - start, "aggregate_tps": tokens / (end - start)}
    first = min(r["chunk_times"][0] for r in ok)
    last = max(r["chunk_times"][-1] for r in ok)
    tokens = sum(max(0, (r["completion_tokens"] or r["token_chunks"]) - 1) for r in ok)
    return {"method": "span", "window_s": last - first, "aggregate_tps": tokens / (last - first) if last > first else None}


def workload_decode(run: Run) -> dict[str, Any]:
    a = run.a
    n = a.decode_streams
    ctx = a.decode_ctx_size or round_up(n * (max(a.decode_contexts) + a.decode_tokens + 256), 1024)
    out: dict[str, Any] = {"settings": {"decode_tokens": a.decode_tokens, "contexts": a.decode_contexts,
                                        "streams": n, "np": n, "ctx": ctx, "endpoint": "/v1/completions"},
                           "servers": {}}
    for server in a.servers:
        res: dict[str, Any] = {"contexts": {}}
        out["servers"][server] = res
        with Served(run, server, n, ctx, "decode") as srv:
            res["server"] = srv.info
            if not srv.ok:
                continue
            for c in a.decode_contexts:
                if run.budget.spent():
                    res["stopped"] = "time budget spent"
                    break
                prompts = [run.texts.text("prose", f"decode-{c}-{i}", c) for i in range(n)]
                entry: dict[str, Any] = {}
                res["contexts"][str(c)] = entry
                # prefill each prompt once (1 token), so the measured requests find them cached and
                # their streams decode side by side instead of waiting for each other's prefill
                warm = [stream(srv.url, "/v1/completions", {**sampling_body(a, 1), "prompt": p},
                               timeout=run.timeout()) for p in prompts]
                entry["prefill"] = [request_record(r) for r in warm]
                body = {**sampling_body(a, a.decode_tokens)}
                one = stream(srv.url, "/v1/completions", {**body, "prompt": prompts[0]}, timeout=run.timeout(),
                             keep_chunk_times=True)
                entry["streams_1"] = {"request": request_record(one), "decode_tps": one.get("decode_tps"),
                                      "server_predicted_per_second": (one.get("timings") or {}).get(
                                          "predicted_per_second")}
                many: list[dict] = [{} for _ in range(n)]
                barrier = threading.Barrier(n)

                def go(i: int, barrier=barrier, many=many, body=body, prompts=prompts) -> None:
                    barrier.wait()
                    many[i] = stream(srv.url, "/v1/completions", {**body, "prompt": prompts[i]},
                                     timeout=run.timeout(), keep_chunk_times=True)

                before = srv.counters()
                threads = [threading.Thread(target=go, args=(i,), daemon=True) for i in range(n)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(run.timeout() + 5)
                after = srv.counters()
                delta = {k: after[k] - before.get(k, 0.0) for k in after}
                many = [m if m else {"ok": False, "error": "no result"} for m in many]
                win = decode_window(many)
                per = [m.get("decode_tps") for m in many]
                entry[f"streams_{n}"] = {
                    "requests": [request_record(m) for m in many],
                    "per_stream_decode_tps": per,
                    "per_stream_decode_tps_p50": bc.percentile(per, 50),
                    "sum_of_stream_tps": sum(p for p in per if p) if all(per) else None,
                    "window_s": win["window_s"],
                    "aggregate_tps": win["aggregate_tps"],
                    "aggregate_method": win["method"],
                    "server_predicted_per_second": [(m.get("timings") or {}).get("predicted_per_second")
                                                    for m in many],
                    "server_counters_delta": delta,
                    # warmslot: generated tokens per second of engine decode time (all streams together)
                    "server_engine_aggregate_tps": (delta["warmslot_decode_tokens_total"]
                                                    / delta["warmslot_decode_seconds_total"])
                    if delta.get("warmslot_decode_seconds_total") else None,
                }
                e = entry[f"streams_{n}"]
                run.log(f"  {server:12s} decode ctx {c}: 1 stream {one.get('decode_tps') or 0:.1f} tok/s; "
                        f"{n} streams {e['aggregate_tps'] or 0:.1f} tok/s aggregate "
                        f"({e['per_stream_decode_tps_p50'] or 0:.1f} per stream)")
                run.save()
            res.update(srv.scrape())
        run.save()
    return out
