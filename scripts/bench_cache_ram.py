"""RAM use of the prompt cache under many alternating conversations.

Starts warmslot on the default model with a small --cache-ram budget and one slot, then
runs `--requests` chat requests that alternate over `--conversations` conversations sharing
a system prompt (so every request evicts a slot into the cache, and the cache evicts least
recently used entries). After every request it records the server's resident memory
(VmRSS) and the cache's bytes from /metrics. The claim checked: the cache never holds more
than its budget, and RSS stays within (RSS after warm-up + budget + a constant).

    python scripts/bench_cache_ram.py [--requests 200] [--budget 64MiB] [--out docs/benchmarks/cache-ram.json]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

if __name__ == "__main__":  # run as a file: the repo root makes the `scripts` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts import bench_common as bc  # noqa: E402
from scripts import server_process as sp  # noqa: E402
from warmslot.server.process.config import parse_size  # noqa: E402


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def metric(text: str, name: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    return 0.0


def conversation(i: int, rng: random.Random) -> list[dict]:
    words = "agent file tool result search weather code test build deploy".split()
    system = "You are a coding agent working on a large repository. " * 12
    user = " ".join(rng.choice(words) for _ in range(120 + 15 * i))
    return [{"role": "system", "content": system}, {"role": "user", "content": f"Task {i}: {user}"}]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--conversations", type=int, default=12)
    ap.add_argument("--budget", default="64MiB")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(bc.REPO_ROOT / "docs" / "benchmarks" / "cache-ram.json"))
    args = ap.parse_args()
    model = args.model or bc.default_model()
    budget = parse_size(args.budget)
    rng = random.Random(0)
    convos = [conversation(i, rng) for i in range(args.conversations)]
    flags = ["-np", "1", "-c", "4096", "-t", str(args.threads), "--cache-ram", args.budget]
    rows = []
    with sp.ServerProcess("warmslot", sp.warmslot_command(model, flags)) as server:
        pid = server.proc.pid
        client = httpx.Client(base_url=server.url, timeout=300)
        for i in range(args.requests):
            convo = convos[i % args.conversations]
            t0 = time.perf_counter()
            r = client.post("/v1/chat/completions", json={"messages": convo, "max_tokens": 4, "temperature": 0})
            r.raise_for_status()
            usage = r.json()["usage"]
            text = client.get("/metrics").text
            rows.append({
                "request": i,
                "conversation": i % args.conversations,
                "prompt_tokens": usage["prompt_tokens"],
                "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
                "seconds": round(time.perf_counter() - t0, 4),
                "rss_bytes": rss_bytes(pid),
                "cache_bytes": metric(text, "warmslot_prompt_cache_bytes"),
                "cache_entries": metric(text, "warmslot_prompt_cache_entries"),
            })
        evictions = metric(client.get("/metrics").text, "warmslot_prompt_cache_evictions_total")
    warm = rows[min(len(rows) - 1, args.conversations)]  # after every conversation ran once
    max_rss = max(r["rss_bytes"] for r in rows)
    max_cache = max(r["cache_bytes"] for r in rows)
    later = rows[args.conversations:]
    result = {
        "benchmark": "cache-ram",
        "machine": bc.machine_info(),
        "model": bc.file_info(model),
        "flags": flags,
        "budget_bytes": budget,
        "requests": args.requests,
        "conversations": args.conversations,
        "max_cache_bytes": max_cache,
        "cache_within_budget": max_cache <= budget,
        "evictions": evictions,
        "rss_after_warmup_bytes": warm["rss_bytes"],
        "max_rss_bytes": max_rss,
        "rss_growth_after_warmup_bytes": max_rss - warm["rss_bytes"],
        "rss_first_bytes": rows[0]["rss_bytes"],
        "rss_last_bytes": rows[-1]["rss_bytes"],
        "mean_cached_fraction_after_warmup": sum(r["cached_tokens"] / r["prompt_tokens"] for r in later) / max(1, len(later)),
        "rows": rows,
    }
    bc.write_json(args.out, result)
    mib = 1 << 20
    print(f"budget {budget / mib:.1f} MiB; cache max {max_cache / mib:.1f} MiB; evictions {evictions:.0f}")
    print(f"RSS first {rows[0]['rss_bytes'] / mib:.1f} MiB, after warm-up {warm['rss_bytes'] / mib:.1f} MiB, "
          f"max {max_rss / mib:.1f} MiB, last {rows[-1]['rss_bytes'] / mib:.1f} MiB")
    print(f"mean cached fraction after warm-up: {result['mean_cached_fraction_after_warmup']:.3f}")
    return 0 if result["cache_within_budget"] else 1


if __name__ == "__main__":
    sys.exit(main())
