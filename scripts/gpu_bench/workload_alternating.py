"""The `alternating` workload (three conversations with a shared prefix taking turns on one
slot) and `restore`, which reads warmslot's prompt-cache figures from that run."""

from __future__ import annotations

import random
import time
from typing import Any

from scripts import bench_common as bc

from . import WARMSLOT
from .agent import Agent
from .client import request_record, sampling_body, stream
from .servers import Run, Served
from .text import random_sentence


def alternating_conversations(run: Run) -> tuple[Agent, list[list[dict]]]:
    a = run.a
    shared = Agent(run.texts, session="alternating", system_tokens=a.alt_shared_tokens, n_tools=a.n_tools,
                   tools_in=a.tools_in, tool_lo=1, tool_hi=1, turns=1, system_seed="alt-system")
    system = {"role": "system", "content": shared.system_message()}
    convs = []
    for name, kind in zip("ABC", ("code", "prose", "log")):
        doc = run.texts.text(kind, f"alt-own-{name}", a.alt_own_tokens)
        user = {"role": "user", "content": f"Conversation {name}. Here is the material to work on:\n\n{doc}\n"
                                           f"Summarise what matters in it."}
        convs.append([system, user])
    return shared, convs


def workload_alternating(run: Run) -> dict[str, Any]:
    a = run.a
    out: dict[str, Any] = {"settings": {"shared_tokens": a.alt_shared_tokens, "own_tokens": a.alt_own_tokens,
                                        "rounds": a.alt_rounds, "gen_tokens": a.gen_tokens, "np": 1,
                                        "ctx": a.ctx_size}, "servers": {}}
    for server in a.servers:
        res: dict[str, Any] = {"requests": []}
        out["servers"][server] = res
        with Served(run, server, 1, a.ctx_size, "alternating") as srv:
            res["server"] = srv.info
            if not srv.ok:
                continue
            shared, convs = alternating_conversations(run)
            tools = shared.request_tools()
            t0 = time.perf_counter()
            for rnd in range(a.alt_rounds):
                for ci, name in enumerate("ABC"):
                    if run.budget.spent():
                        res["stopped"] = "time budget spent"
                        break
                    body = {**sampling_body(a, a.gen_tokens), "messages": convs[ci]}
                    if tools:
                        body["tools"] = tools
                    r = stream(srv.url, "/v1/chat/completions", body, timeout=run.timeout())
                    row = {"round": rnd + 1, "conversation": name, "return": rnd > 0, **request_record(r)}
                    res["requests"].append(row)
                    run.log(f"  {server:12s} round {rnd + 1} {name}: prompt {row['prompt_tokens']} cached "
                            f"{row['cached_tokens']} computed {row['computed_tokens']} TTFT "
                            f"{(row['ttft_s'] or 0) * 1000:.0f} ms" + (f" ERROR {row['error'][:200]}"
                                                                       if row.get("error") else ""))
                    if r.get("ok"):
                        rng = random.Random(f"alt-followup:{name}:{rnd}")
                        convs[ci] = convs[ci] + [
                            {"role": "assistant", "content": r.get("content") or "",
                             **({"reasoning_content": r["reasoning"]} if r.get("reasoning") else {})},
                            {"role": "user", "content": " ".join(random_sentence(rng) for _ in range(3))},
                        ]
                if res.get("stopped"):
                    break
            res["wall_s"] = time.perf_counter() - t0
            res.update(srv.scrape())
            rows = res["requests"]
            ok = [r for r in rows if r.get("ok")]
            res["summary"] = {
                "requests": len(rows), "ok": len(ok),
                "ttft_s_p50_returns": bc.percentile([r["ttft_s"] for r in ok if r["return"]], 50),
                "ttft_s_p50_first": bc.percentile([r["ttft_s"] for r in ok if not r["return"]], 50),
                "computed_tokens_returns": sum(r["computed_tokens"] or 0 for r in ok if r["return"]),
                "prompt_tokens_returns": sum(r["prompt_tokens"] or 0 for r in ok if r["return"]),
                "cached_tokens_returns": sum(r["cached_tokens"] or 0 for r in ok if r["return"]),
            }
        run.save()
    return out


def workload_restore(run: Run, alternating: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"source": "the alternating workload's /metrics and /slots", "servers": {}}
    for server, res in (alternating.get("servers") or {}).items():
        m = res.get("metrics") or {}
        slots = res.get("slots") or {}
        if server == WARMSLOT:
            loaded = m.get("warmslot_prompt_cache_loaded_bytes_total")
            load_s = m.get("warmslot_prompt_cache_load_seconds_total")
            saved = m.get("warmslot_prompt_cache_saved_bytes_total")
            save_s = m.get("warmslot_prompt_cache_save_seconds_total")
            out["servers"][server] = {
                "prompt_cache_loaded_bytes": loaded, "prompt_cache_load_seconds": load_s,
                "load_gb_per_s": loaded / load_s / 1e9 if loaded and load_s else None,
                "prompt_cache_saved_bytes": saved, "prompt_cache_save_seconds": save_s,
                "save_gb_per_s": saved / save_s / 1e9 if saved and save_s else None,
                "prompt_cache_hits": m.get("warmslot_prompt_cache_hits_total"),
                "prompt_cache_misses": m.get("warmslot_prompt_cache_misses_total"),
                "checkpoints_created": m.get("warmslot_checkpoints_created_total"),
                "checkpoints_restored": m.get("warmslot_checkpoints_restored_total"),
                "logits_reused": m.get("warmslot_logits_reused_total"),
                "checkpoint_bytes_held": slots.get("checkpoint_bytes", m.get("warmslot_checkpoint_bytes")),
                "prompt_cache_bytes_held": slots.get("prompt_cache_bytes", m.get("warmslot_prompt_cache_bytes")),
                "prompt_tokens_by_source": {k.split("source=")[1].rstrip("}"): v for k, v in m.items()
                                            if k.startswith("warmslot_prompt_tokens_total{")},
            }
        else:
            out["servers"][server] = {
                "note": "llama-server reports no prompt-cache load bytes or times; its counters:",
                "metrics": {k: v for k, v in m.items() if k.startswith("llamacpp:")},
                "slots": slots.get("raw"),
            }
    return out
