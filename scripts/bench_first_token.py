#!/usr/bin/env python3
"""Time to the first token, and to the second, of short streamed prompts on a running server.

Each request is a distinct prompt of a few words (nothing to reuse), greedy, 8 tokens
(`ignore_eos`), streamed through `/v1/completions`; the client notes when each chunk with
text arrives. Prints and, with --out, appends to a JSON list: the medians and minima over
--requests requests (after two not counted).

    python scripts/bench_first_token.py [--url http://localhost:8080] [--requests 24]
        [--label TEXT] [--out results.json]
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


def one(url: str, prompt: str) -> list[float]:
    """Seconds from sending to each chunk that carries text."""
    body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True, "stream": True}
    t0, times = time.perf_counter(), []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]
            if choices[0].get("text"):
                times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://localhost:8080")
    p.add_argument("--requests", type=int, default=24)
    p.add_argument("--label", default="")
    p.add_argument("--out")
    a = p.parse_args()
    tag = random.randrange(10**6)
    prompt = "Note {}-{}: the harbor lanterns and the copper orbit of the quiet meadow"
    for i in range(2):  # warm-up
        one(a.url, prompt.format(tag, f"w{i}"))
    runs = [one(a.url, prompt.format(tag, i)) for i in range(a.requests)]
    first = [t[0] for t in runs if t]
    gap = [t[1] - t[0] for t in runs if len(t) > 1]
    row = {"label": a.label, "requests": a.requests, "ttft_ms_median": round(statistics.median(first) * 1000, 1),
           "ttft_ms_min": round(min(first) * 1000, 1), "first_gap_ms_median": round(statistics.median(gap) * 1000, 1)}
    print(row, flush=True)
    if a.out:
        bc.append_json(a.out, [row])


if __name__ == "__main__":
    main()
