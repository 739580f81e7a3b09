"""The `concurrent` workload: several agent replays at once on -np N, sharing a system prompt."""

from __future__ import annotations

import threading
import time
from typing import Any

from scripts import bench_common as bc

from .agent import Agent, tool_sizes
from .client import request_record, sampling_body, stream
from .servers import Run, Served, round_up


def workload_concurrent(run: Run) -> dict[str, Any]:
    a = run.a
    lo, hi = a.tool_tokens
    n = a.conc_clients
    per_stream = a.conc_system_tokens + 400 + max(sum(tool_sizes(a.conc_turns, lo, hi, 3 * i)) for i in range(n)) \
        + a.conc_turns * (a.gen_tokens + 200)
    ctx = a.conc_ctx_size or round_up(int(per_stream * 1.1) * n, 1024)
    out: dict[str, Any] = {"settings": {"clients": n, "system_tokens": a.conc_system_tokens, "turns": a.conc_turns,
                                        "gen_tokens": a.gen_tokens, "np": n, "ctx": ctx,
                                        "shared_system_prompt": not a.conc_distinct_system}, "servers": {}}
    for server in a.servers:
        res: dict[str, Any] = {}
        out["servers"][server] = res
        with Served(run, server, n, ctx, "concurrent") as srv:
            res["server"] = srv.info
            if not srv.ok:
                continue
            agents = [Agent(run.texts, session=f"conc-{i}", system_tokens=a.conc_system_tokens, n_tools=a.n_tools,
                            tools_in=a.tools_in, tool_lo=lo, tool_hi=hi, turns=a.conc_turns, size_offset=3 * i,
                            task_seed=f"conc-task-{i}",
                            system_seed="conc-system" + (f"-{i}" if a.conc_distinct_system else ""))
                      for i in range(n)]
            if not a.conc_distinct_system:  # one session line, so the whole system prompt is shared
                for ag in agents:
                    ag.session = "conc"
            streams: list[list[dict]] = [[] for _ in range(n)]
            barrier = threading.Barrier(n)
            t_origin = [0.0]

            def client(i: int, agents=agents, barrier=barrier, streams=streams, t_origin=t_origin) -> None:
                ag = agents[i]
                tools = ag.request_tools()
                messages = ag.first_messages()
                barrier.wait()
                for turn in range(1, a.conc_turns + 1):
                    if run.budget.spent():
                        streams[i].append({"turn": turn, "ok": False, "error": "time budget spent"})
                        return
                    body = {**sampling_body(a, a.gen_tokens), "messages": messages}
                    if tools:
                        body["tools"] = tools
                    r = stream(srv.url, "/v1/chat/completions", body, timeout=run.timeout())
                    row = {"client": i, "turn": turn, "t_offset_s": r["t_start"] - t_origin[0], **request_record(r)}
                    streams[i].append(row)
                    if not r.get("ok"):
                        return
                    call = {"id": f"call_{i}_{turn}", "type": "function",
                            "function": ag.call(turn - 1)[0]["function"]}
                    result, _ = ag.tool_result(turn - 1)
                    messages = messages + [{"role": "assistant", "content": "", "tool_calls": [call]},
                                           {"role": "tool", "tool_call_id": call["id"], "content": result}]

            t_origin[0] = time.perf_counter()
            threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(n)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(max(1.0, run.timeout() * a.conc_turns))
            wall = time.perf_counter() - t_origin[0]
            rows = [r for s in streams for r in s]
            ok = [r for r in rows if r.get("ok")]
            res["requests"] = rows
            res["wall_s"] = wall
            gen = sum(r["completion_tokens"] or 0 for r in ok)
            per_client = []
            for i, s in enumerate(streams):
                sok = [r for r in s if r.get("ok")]
                per_client.append({"client": i, "requests": len(s), "ok": len(sok),
                                   "decode_tps_p50": bc.percentile([r["decode_tps"] for r in sok], 50),
                                   "ttft_s_p50": bc.percentile([r["ttft_s"] for r in sok], 50),
                                   "wall_s": (sok[-1]["t_offset_s"] + sok[-1]["total_s"]) if sok else None})
            res["summary"] = {
                "requests": len(rows), "ok": len(ok),
                "errors": [r.get("error") for r in rows if not r.get("ok")][:10],
                "generated_tokens": gen,
                "generated_tokens_per_wall_s": gen / wall if wall else None,
                "decode_tps_per_request_p50": bc.percentile([r["decode_tps"] for r in ok], 50),
                "decode_tps_sum_of_client_p50": sum(c["decode_tps_p50"] or 0 for c in per_client),
                "ttft_s_p50": bc.percentile([r["ttft_s"] for r in ok], 50),
                "ttft_s_p95": bc.percentile([r["ttft_s"] for r in ok], 95),
                "computed_tokens_total": sum(r["computed_tokens"] or 0 for r in ok),
                "prompt_tokens_total": sum(r["prompt_tokens"] or 0 for r in ok),
                "per_client": per_client,
            }
            res.update(srv.scrape())
            s = res["summary"]
            run.log(f"  {server:12s} concurrent: {len(ok)}/{len(rows)} ok, wall {wall:.1f}s, TTFT p50 "
                    f"{(s['ttft_s_p50'] or 0) * 1000:.0f} ms p95 {(s['ttft_s_p95'] or 0) * 1000:.0f} ms, decode p50 "
                    f"{s['decode_tps_per_request_p50'] or 0:.1f} tok/s per stream")
        run.save()
    return out
