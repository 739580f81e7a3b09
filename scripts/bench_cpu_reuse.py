#!/usr/bin/env python3
"""CPU time to first token when a prompt is computed cold and when part of it is reused.

Three chat conversations A, B and C share a system prompt of about --shared-words words and
differ in their user message (about --own-words words). On one slot they run A, B, C, A, B,
C, ... On both servers the first A is computed whole (cold); B and C after it reuse the shared
system prompt and compute only their own part ("partial"); later returns of a conversation
may reuse more. Every request generates one token, so the client's time to first token is the
time to evaluate what was not reused, plus each server's own overhead.

Per request the JSON records the prompt, cached and computed token counts, and the TTFT.
The summary compares requests that computed the same number of tokens on both servers, so
the ratio says how much slower or faster warmslot is for the same work. Only one server runs
at a time; the servers alternate between rounds.

    python scripts/bench_cpu_reuse.py [--llama-server build/llama.cpp/bin/llama-server] [--rounds 2]

Build llama-server first with scripts/build_llama_server.sh.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import httpx

if __name__ == "__main__":  # run as a file: the repo root makes the `scripts` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts import bench_common as bc  # noqa: E402
from scripts import server_process as sp  # noqa: E402
from scripts.bench_client import stream_request  # noqa: E402

WARMSLOT, LLAMA_SERVER = "warmslot", "llama-server"
WORDS = ("river stone quiet lantern harbor maple signal copper orbit meadow velvet canyon ember "
         "glacier pepper violet thunder saddle marble falcon").split()


def words(seed: int, n: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n))


def conversations(a: argparse.Namespace) -> dict[str, list[dict]]:
    system = "You are a careful assistant. Notes follow.\n" + words(1, a.shared_words)
    return {
        name: [{"role": "system", "content": system}, {"role": "user", "content": words(10 + i, a.own_words)}]
        for i, name in enumerate("ABC")
    }


def command(name: str, a: argparse.Namespace, model: str) -> list[str]:
    flags = ["-np", "1", "-c", str(a.ctx_size), "-t", str(a.threads), "-tb", str(a.threads), "-ngl", "0"]
    if name == WARMSLOT:
        return sp.warmslot_command(model, flags, python=a.python)
    return sp.llama_server_command(model, [*flags, "--jinja"], binary=a.llama_server)


def run_server(name: str, a: argparse.Namespace, model: str, round_no: int) -> list[dict]:
    convs = conversations(a)
    rows = []
    with sp.ServerProcess(name, command(name, a, model)) as srv, httpx.Client(timeout=600) as client:
        for i in range(a.requests):
            conv = "ABC"[i % 3]
            time.sleep(a.pause)
            body = {"model": "bench", "messages": convs[conv], "max_tokens": 1, "temperature": 0.0, "stream": True,
                    "stream_options": {"include_usage": True}}
            r = stream_request(srv.url, "/v1/chat/completions", body, client=client, keep_chunk_times=False)
            if not r.ok:
                raise RuntimeError(f"{name}: request failed ({r.status}): {r.error}")
            computed = r.prompt_tokens - (r.cached_tokens or 0)
            if (r.timings or {}).get("prompt_n") is not None:
                computed = r.timings["prompt_n"]
            rows.append({"round": round_no, "request": i, "conversation": conv, "prompt_tokens": r.prompt_tokens,
                         "computed_tokens": computed, "ttft_s": r.ttft_s,
                         "server_prompt_ms": (r.timings or {}).get("prompt_ms")})
            print(f"  {name:12s} {conv}: prompt {r.prompt_tokens} computed {computed} TTFT {r.ttft_s * 1000:.0f} ms",
                  flush=True)
    return rows


def kind(row: dict) -> str:
    if row["computed_tokens"] >= row["prompt_tokens"]:
        return "cold"
    return "partial" if row["computed_tokens"] > 0 else "whole prompt reused"


def summarise(rows: list[dict]) -> list[dict]:
    """Per kind of request (cold, partial, whole prompt reused) and server: median TTFT and
    median time per computed token. The two servers' chat templates can render a few tokens
    differently, so requests of the same kind are compared per computed token."""
    out = []
    for k in ("cold", "partial", "whole prompt reused"):
        entry: dict = {"kind": k}
        for server in (WARMSLOT, LLAMA_SERVER):
            rs = [r for r in rows if r["server"] == server and kind(r) == k]
            if not rs:
                continue
            entry[server] = {
                "n": len(rs),
                "computed_tokens": statistics.median(r["computed_tokens"] for r in rs),
                "ttft_ms": round(statistics.median(r["ttft_s"] for r in rs) * 1000, 1),
                "ms_per_computed_token": round(statistics.median(r["ttft_s"] * 1000 / r["computed_tokens"] for r in rs), 3)
                if rs[0]["computed_tokens"] else None,
            }
        w, l = entry.get(WARMSLOT), entry.get(LLAMA_SERVER)
        if w and l and w["ms_per_computed_token"] and l["ms_per_computed_token"]:
            entry["ratio_per_token"] = round(w["ms_per_computed_token"] / l["ms_per_computed_token"], 3)
        out.append(entry)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--llama-server", default=str(sp.DEFAULT_LLAMA_SERVER))
    p.add_argument("--model", "-m", default=None, help="GGUF model (default: the embedded Gemma 3 270M)")
    p.add_argument("--shared-words", type=int, default=700)
    p.add_argument("--own-words", type=int, default=190)
    p.add_argument("--requests", type=int, default=9, help="requests per server and round (A, B, C, A, ...)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", "-t", type=int, default=2)
    p.add_argument("--ctx-size", "-c", type=int, default=4096)
    p.add_argument("--pause", type=float, default=0.3)
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--out", default=str(bc.REPO_ROOT / "docs" / "benchmarks" / "cpu-reuse.json"))
    a = p.parse_args()
    model = a.model or bc.default_model()
    rows: list[dict] = []
    for round_no in range(a.rounds):
        order = (WARMSLOT, LLAMA_SERVER) if round_no % 2 == 0 else (LLAMA_SERVER, WARMSLOT)
        for name in order:
            print(f"[round {round_no}] {name}", flush=True)
            rows += [dict(r, server=name) for r in run_server(name, a, model, round_no)]
    result = {"benchmark": "cpu-reuse", "started": bc.now_iso(), "machine": bc.machine_info(),
              "settings": {k: v for k, v in vars(a).items()}, "summary": summarise(rows), "requests": rows}
    bc.write_json(a.out, result)
    for s in result["summary"]:
        print(s)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
