"""Per-request overhead at a long history: HTTP, JSON, chat template, tokenization, routing.

Starts warmslot on the default model and sends a ~30K-token agent history as a chat
request with `max_tokens: 0`. After a first request has evaluated it, the same request again
is served entirely from the slot (its last token's logits were saved), so the engine
evaluates nothing and the round-trip time is the request path's own overhead. Also measures
the same history plus one new short message (a realistic next turn: only the new segment is
tokenized; its prefill is engine time, reported apart by the server's `timings`).

    python scripts/bench_overhead.py [--tokens 30000] [--reps 20] [--out docs/benchmarks/overhead.json]
"""

from __future__ import annotations

import argparse
import json
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

WORDS = "the agent reads the file then calls a tool with json arguments and waits for the result of the build".split()


def history(target_tokens: int, rng: random.Random) -> list[dict]:
    messages = [{"role": "system", "content": "You are a coding agent. " + " ".join(rng.choice(WORDS) for _ in range(1500))}]
    n = 0
    turn = 0
    while n < target_tokens:
        call = {"id": f"c{turn}", "type": "function", "function": {"name": "read_file", "arguments": json.dumps({"path": f"src/m{turn}.py"})}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        body = " ".join(rng.choice(WORDS) for _ in range(rng.randint(300, 2500)))
        messages.append({"role": "tool", "tool_call_id": f"c{turn}", "content": body})
        n += len(body) // 4 + 40
        turn += 1
    messages.insert(1, {"role": "user", "content": "Fix the failing test."})
    return messages


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, default=30000)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(bc.REPO_ROOT / "docs" / "benchmarks" / "overhead.json"))
    args = ap.parse_args()
    model = args.model or bc.default_model()
    rng = random.Random(0)
    messages = history(args.tokens, rng)
    flags = ["-np", "1", "-c", "32768", "-t", str(args.threads)]
    with sp.ServerProcess("warmslot", sp.warmslot_command(model, flags)) as server:
        client = httpx.Client(base_url=server.url, timeout=600)
        body = {"messages": messages, "max_tokens": 1}
        first = client.post("/v1/chat/completions", json=body).json()
        prompt_tokens = first["usage"]["prompt_tokens"]
        repeat = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            r = client.post("/v1/chat/completions", json=body).json()
            repeat.append(time.perf_counter() - t0)
            assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == prompt_tokens, r["usage"]
        turn = []
        for i in range(args.reps):
            extended = messages + [{"role": "user", "content": f"Now check file number {i} and report."}]
            t0 = time.perf_counter()
            r = client.post("/v1/chat/completions", json=dict(body, messages=extended)).json()
            elapsed = time.perf_counter() - t0
            engine = (r["timings"]["prompt_ms"] + r["timings"]["predicted_ms"]) / 1000
            turn.append((elapsed, engine, r["usage"]["prompt_tokens"] - r["usage"]["prompt_tokens_details"]["cached_tokens"]))
    result = {
        "benchmark": "request-overhead",
        "machine": bc.machine_info(),
        "model": bc.file_info(model),
        "prompt_tokens": prompt_tokens,
        "request_bytes": len(json.dumps(body)),
        "repeat_ms": {"median": statistics.median(repeat) * 1000, "min": min(repeat) * 1000, "max": max(repeat) * 1000},
        "next_turn_total_ms": statistics.median(t for t, _, _ in turn) * 1000,
        "next_turn_engine_ms": statistics.median(e for _, e, _ in turn) * 1000,
        "next_turn_overhead_ms": statistics.median((t - e) for t, e, _ in turn) * 1000,
        "next_turn_computed_tokens": statistics.median(c for _, _, c in turn),
    }
    bc.write_json(args.out, result)
    print(f"history of {prompt_tokens} tokens ({result['request_bytes'] // 1024} KiB of JSON)")
    print(f"exact repeat, nothing evaluated: median {result['repeat_ms']['median']:.1f} ms (min {result['repeat_ms']['min']:.1f})")
    print(f"next turn: total {result['next_turn_total_ms']:.1f} ms = engine {result['next_turn_engine_ms']:.1f} ms "
          f"+ request path {result['next_turn_overhead_ms']:.1f} ms ({result['next_turn_computed_tokens']:.0f} tokens computed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
