#!/usr/bin/env python3
"""CPU speed per phase, warmslot against llama-server: both up at once, asked in turn.

Both servers load the same model side by side, each with its own default flags except the
context size (`-c`, so the deepest prompt fits) and, where `--cpus` pins them to a set of
cores, the thread count (llama.cpp counts the host's cores, not the ones a process may use).
They get the same requests through the same endpoint (`/v1/completions`, raw text, greedy),
one server at a time, in pairs whose order alternates (warmslot then llama-server, then
llama-server then warmslot), so slow drift of the machine falls on both.

Phases, each a number of pairs:

- ``decode``: a short distinct prompt, `--decode-tokens` generated (`ignore_eos`); the
  speed is (completion tokens - 1) / (last token - first token), from the stream.
- ``cold``: a distinct prompt of about `--cold-tokens` tokens, one token generated; the time
  is the client's time to first token (prefill plus each server's own overhead).
- ``depth-D``: a prefix of about D tokens is computed once per server (not timed), then each
  pair sends that prefix plus a distinct tail of about `--tail-tokens` tokens: the time to
  first token is the prefill of the tail at depth D.
- ``decode-depth-D`` (asked for): after the depth-D pairs, that prefix plus a short distinct
  tail, `--decode-tokens` generated: the decode speed at depth D.
- ``partial``: two conversations share a prefix of about `--shared-tokens` tokens and differ
  in an own part of about `--own-tokens`; they alternate, so each request reuses the shared
  prefix and computes its own part (on warmslot possibly on another slot than the last one).

Per pair the JSON records both servers' prompt, cached and computed token counts and times,
and the ratio warmslot / llama-server of the time (prefill phases) or of the speed (decode).
The summary gives per phase the median ratio, its spread (min, max) and the medians of each
server. A pair whose two servers computed different token counts is kept but flagged.

Each server also reports its own account of a request (`timings`, llama-server's fields): the
prefill from the request's start on a slot to its first token, and the decode after it. The
summary's `own_ratio_median` compares those, and `outside_ms` is the client's time to first
token less the server's prefill (HTTP, tokenization, queueing): the two split a phase's ratio
into llama.cpp's compute and each server's own overhead.

    python scripts/bench_cpu_phases.py [--model PATH] [--llama-server PATH] [--cpus 0,1]
        [--pairs 5] [--depths 2048,6144,16384] --out docs/benchmarks/cpu-phases-...json

Build llama-server first with scripts/build_llama_server.sh (on the GPU machine it is in the
bundle's bin/; hide the GPU with CUDA_VISIBLE_DEVICES= to measure the CPU).
"""

from __future__ import annotations

import argparse
import os
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
         "glacier pepper violet thunder saddle marble falcon window garden silver morning castle "
         "forest bridge candle mirror engine pocket").split()


def text(seed: int, n_tokens: int) -> str:
    """About `n_tokens` tokens of words (one word is about one token, with its space)."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_tokens))


def server_flags(a: argparse.Namespace) -> list[str]:
    flags = ["-c", str(a.ctx_size)]
    if a.cpus:
        n = len(a.cpus.split(","))
        flags += ["-t", str(n), "-tb", str(n)]
    return flags


def start_servers(a: argparse.Namespace, model: str, out: Path) -> dict[str, sp.ServerProcess]:
    pin = ["taskset", "-c", a.cpus] if a.cpus else []
    cmds = {
        WARMSLOT: pin + sp.warmslot_command(model, server_flags(a) + a.warmslot_args.split(), python=a.python),
        LLAMA_SERVER: pin + sp.llama_server_command(model, server_flags(a) + a.llama_server_args.split(),
                                                    binary=a.llama_server),
    }
    logs = Path(a.logs) if a.logs else None  # else temporary files, removed when the servers stop
    servers = {name: sp.ServerProcess(name, cmd, start=False, ready_timeout=600,
                                      log_path=logs / f"{out.stem}-{name}.log" if logs else None)
               for name, cmd in cmds.items()}
    sp.start_together(list(servers.values()))
    return servers


def ask(server: sp.ServerProcess, prompt: str, max_tokens: int) -> dict:
    body = {"model": "bench", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True}
    r = stream_request(server.url, "/v1/completions", body, keep_chunk_times=False)
    if not r.ok:
        raise RuntimeError(f"{server.name}: {r.error}")
    timings = r.timings or {}
    cached = r.cached_tokens if r.cached_tokens is not None else timings.get("cache_n")
    # the server's own account (`timings`, llama-server's fields): prompt_ms runs from the
    # request's start on a slot to its first token; predicted_ms from there to the last token
    prompt_ms, predicted_ms, n = timings.get("prompt_ms"), timings.get("predicted_ms"), timings.get("predicted_n")
    return {"prompt_tokens": r.prompt_tokens, "cached_tokens": cached,
            "computed_tokens": (r.prompt_tokens or 0) - (cached or 0),
            "ttft_s": r.ttft_s, "decode_tps": r.decode_tps, "completion_tokens": r.completion_tokens,
            "server_prompt_ms": prompt_ms,
            "server_decode_tps": (n - 1) * 1000 / predicted_ms if n and n > 1 and predicted_ms else None,
            "outside_ms": r.ttft_s * 1000 - prompt_ms if r.ttft_s is not None and prompt_ms is not None else None}


def pair(servers: dict, order: tuple[str, str], prompt_of, max_tokens: int, pause: float) -> dict:
    row = {}
    for name in order:
        time.sleep(pause)
        row[name] = ask(servers[name], prompt_of(name), max_tokens)
    return row


def phases(a: argparse.Namespace, servers: dict) -> list[dict]:
    rows: list[dict] = []
    orders = [(WARMSLOT, LLAMA_SERVER), (LLAMA_SERVER, WARMSLOT)]
    tag = random.Random(a.seed).randrange(10**6)

    def run(phase: str, n: int, prompt_of_i, max_tokens: int) -> None:
        for i in range(n):
            row = pair(servers, orders[i % 2], lambda name: prompt_of_i(i), max_tokens, a.pause)
            rows.append({"phase": phase, "pair": i, "first": orders[i % 2][0], **row})
            print(f"  {phase} {i}: " + " | ".join(
                f"{s} computed {row[s]['computed_tokens']} ttft {row[s]['ttft_s'] * 1000:.0f} ms"
                + (f" {row[s]['decode_tps']:.1f} tok/s" if max_tokens > 1 and row[s]['decode_tps'] else "")
                for s in (WARMSLOT, LLAMA_SERVER)), flush=True)

    print("warm-up", flush=True)
    for s in servers.values():
        ask(s, f"Warm-up {tag}. " + text(a.seed, 64), 8)
    if "decode" in a.phases:
        run("decode", a.pairs, lambda i: f"Sample {tag}-{i}. " + text(a.seed + 100 + i, 48), a.decode_tokens)
    if "cold" in a.phases:
        run("cold", a.pairs, lambda i: f"Document {tag}-{i}. " + text(a.seed + 200 + i, a.cold_tokens), 1)
    for depth in (a.depths if "depth" in a.phases else []):
        prefix = f"Archive {tag}-{depth}. " + text(a.seed + depth, depth)
        for s in servers.values():  # computed once per server, not timed
            ask(s, prefix, 1)
        run(f"depth-{depth}", a.depth_pairs, lambda i, prefix=prefix, depth=depth:
            prefix + f" Note {i}. " + text(a.seed + depth + 1000 + i, a.tail_tokens), 1)
        if "decode-depth" in a.phases:
            run(f"decode-depth-{depth}", a.depth_pairs, lambda i, prefix=prefix, depth=depth:
                prefix + f" Reply {i}. " + text(a.seed + depth + 2000 + i, 32), a.decode_tokens)
    if "partial" not in a.phases:
        return rows
    shared = f"Handbook {tag}. " + text(a.seed + 300, a.shared_tokens)
    for s in servers.values():
        ask(s, shared, 1)
    run("partial", 2 * a.pairs, lambda i: shared + f" Conversation {'AB'[i % 2]} turn {i}. "
        + text(a.seed + 400 + i, a.own_tokens), 1)
    return rows


def ratio(row: dict, phase: str, own: bool = False) -> float | None:
    """warmslot / llama-server as the client saw it, or (`own`) as each server accounts for
    its own prefill or decode, which leaves out HTTP, tokenization and queueing."""
    w, l = row[WARMSLOT], row[LLAMA_SERVER]
    if phase.startswith("decode"):  # speed: higher is better
        key = "server_decode_tps" if own else "decode_tps"
        return bc.ratio(w.get(key), l.get(key))
    key = "server_prompt_ms" if own else "ttft_s"  # time: lower is better
    return bc.ratio(w.get(key), l.get(key))


def summarise(rows: list[dict]) -> list[dict]:
    out = []
    for phase in dict.fromkeys(r["phase"] for r in rows):
        rs = [r for r in rows if r["phase"] == phase]
        ratios = [x for x in (ratio(r, phase) for r in rs) if x is not None]
        decode = phase.startswith("decode")
        key = "decode_tps" if decode else "ttft_s"
        entry = {"phase": phase, "pairs": len(rs),
                 "measure": "speed ratio (higher is better)" if decode else "time ratio (lower is better)",
                 "ratio_median": round(statistics.median(ratios), 3) if ratios else None,
                 "ratio_min": round(min(ratios), 3) if ratios else None,
                 "ratio_max": round(max(ratios), 3) if ratios else None,
                 "unequal_work_pairs": sum(r[WARMSLOT]["computed_tokens"] != r[LLAMA_SERVER]["computed_tokens"] for r in rs)}
        own = [x for x in (ratio(r, phase, own=True) for r in rs) if x is not None]
        entry["own_ratio_median"] = round(statistics.median(own), 3) if own else None
        for s in (WARMSLOT, LLAMA_SERVER):
            entry[s] = {key: round(statistics.median(r[s][key] for r in rs), 4),
                        "computed_tokens": statistics.median(r[s]["computed_tokens"] for r in rs)}
            own_key = "server_decode_tps" if decode else "server_prompt_ms"
            for k in (own_key, "outside_ms"):
                m = bc.percentile((r[s].get(k) for r in rs), 50)  # the median of those reported
                entry[s][k] = round(m, 2) if m is not None else None
        if not decode and entry["ratio_median"]:
            entry["speed_ratio_median"] = round(1 / entry["ratio_median"], 3)
        out.append(entry)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--llama-server", default=str(sp.DEFAULT_LLAMA_SERVER))
    p.add_argument("--model", "-m", default=None, help="GGUF model (default: the embedded Gemma 3 270M)")
    p.add_argument("--cpus", default=None, help="pin both servers to these cores (taskset -c), e.g. 0,1")
    p.add_argument("--ctx-size", "-c", type=int, default=None,
                   help="default: four times the deepest prompt, so that each of 4 slots holds it on either server")
    p.add_argument("--phases", type=lambda s: set(s.split(",")), default={"decode", "cold", "depth", "partial"},
                   help="comma-separated subset of decode,cold,depth,decode-depth,partial (decode-depth: "
                   "decoding after each depth's prefix; it needs depth)")
    p.add_argument("--warmslot-args", default="", help="extra flags for warmslot (e.g. '-fa on')")
    p.add_argument("--llama-server-args", default="", help="extra flags for llama-server")
    p.add_argument("--pairs", type=int, default=5, help="pairs of the decode and cold phases")
    p.add_argument("--depth-pairs", type=int, default=3)
    p.add_argument("--depths", type=lambda s: [int(x) for x in s.split(",") if x], default=[2048, 6144, 16384])
    p.add_argument("--decode-tokens", type=int, default=128)
    p.add_argument("--cold-tokens", type=int, default=1536)
    p.add_argument("--tail-tokens", type=int, default=512)
    p.add_argument("--shared-tokens", type=int, default=1200)
    p.add_argument("--own-tokens", type=int, default=300)
    p.add_argument("--pause", type=float, default=0.3)
    p.add_argument("--seed", type=int, default=int(time.time()))
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--out", required=True)
    p.add_argument("--logs", default=None, help="keep both servers' logs in this folder")
    a = p.parse_args()
    model = a.model or bc.default_model()
    if a.ctx_size is None:
        a.ctx_size = 4 * (max([*a.depths, a.cold_tokens, a.shared_tokens]) + a.tail_tokens + 1024)
    out = Path(a.out)
    started = bc.now_iso()
    servers = start_servers(a, model, out)
    try:
        rows = phases(a, servers)
    finally:
        for s in servers.values():
            s.stop()
    result = {"benchmark": "cpu-phases", "started": started, "finished": bc.now_iso(),
              "machine": bc.machine_info(), "model": bc.file_info(model),
              "llama_server": bc.llama_server_build_info(a.llama_server),
              "settings": {**vars(a), "phases": sorted(a.phases), "server_flags": server_flags(a), "cpus_allowed": sorted(os.sched_getaffinity(0))},
              "summary": summarise(rows), "pairs": rows}
    bc.write_json(out, result)
    print(bc.format_table(["phase", "pairs", "ratio median", "min", "max", "own ratio", "outside ms (w / l)", "unequal"],
                         [[s["phase"], s["pairs"], s["ratio_median"], s["ratio_min"], s["ratio_max"],
                           s["own_ratio_median"], f'{s[WARMSLOT]["outside_ms"]} / {s[LLAMA_SERVER]["outside_ms"]}',
                           s["unequal_work_pairs"]] for s in result["summary"]]))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
