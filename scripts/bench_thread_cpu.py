#!/usr/bin/env python3
"""CPU time of each thread of a running server per generated token, over one request.

On 2 cores, every millisecond that a thread other than llama.cpp's spends during a decode is
taken from a core that llama.cpp's threads decode on. This reads /proc/PID/task/*/stat around
one `/v1/completions` request (greedy, `ignore_eos`), streamed or not, and prints each
thread's CPU milliseconds per generated token (`main` is the thread that runs the event
loop); wall times on 2 cores vary by 10% from run to run, these CPU times much less.

    python scripts/bench_thread_cpu.py --pid PID [--url http://localhost:8080] [--tokens 500]
        [--stream] [--runs 2] [--out results.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import httpx

if __name__ == "__main__":  # run as a file: the repo root makes the `scripts` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts import bench_common as bc  # noqa: E402


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of each thread of `pid`, by thread id."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        out[tid] = (int(fields[11]) + int(fields[12])) / tick
    return out


def one_request(url: str, pid: int, tokens: int, stream: bool) -> dict:
    body = {"prompt": "Once upon a time in a quiet harbor town,", "max_tokens": tokens, "temperature": 0,
            "ignore_eos": True, "stream": stream}
    before, t0 = thread_cpu(pid), time.monotonic()
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for _ in r.iter_raw():
            pass
    wall, after = time.monotonic() - t0, thread_cpu(pid)
    per = {("main" if tid == str(pid) else tid): (cpu - before.get(tid, 0.0)) * 1000 / tokens for tid, cpu in after.items()}
    return {"stream": stream, "tokens": tokens, "wall_s": round(wall, 3), "tokens_per_s": round(tokens / wall, 2),
            "cpu_ms_per_token": {k: round(v, 3) for k, v in sorted(per.items(), key=lambda kv: -kv[1]) if v > 0}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pid", type=int, required=True, help="the server's process id")
    p.add_argument("--url", default="http://localhost:8080")
    p.add_argument("--tokens", type=int, default=500)
    p.add_argument("--stream", action="store_true", help="stream the reply (default: whole)")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--label", default="", help="what the server under test is (kept in --out)")
    p.add_argument("--out", help="append the runs to this JSON file (a list)")
    a = p.parse_args()
    one_request(a.url, a.pid, 16, a.stream)  # warm-up
    runs = []
    for _ in range(a.runs):
        runs.append({"label": a.label, **one_request(a.url, a.pid, a.tokens, a.stream)})
        print(runs[-1], flush=True)
    if a.out:
        bc.append_json(a.out, runs)


if __name__ == "__main__":
    main()
