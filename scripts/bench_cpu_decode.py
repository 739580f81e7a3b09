#!/usr/bin/env python3
"""CPU decode throughput: warmslot vs llama-server, same model, prompt and settings.

Both servers run with `-np 1 -c 4096 -t N -tb N -b 2048 -ub 512 -ngl 0` and get the same
streamed /v1/completions requests: a fixed ~100-token text prompt, greedy decoding and
`ignore_eos`, so each generates exactly --n-predict tokens. Only one server runs at a time.

Per request the client records time to first token (TTFT) and decode speed,
(completion_tokens - 1) / (t_last_token - t_first_token), from the SSE stream; llama-server's
own `timings` (predicted_per_second) are recorded as well.

The servers are measured in rounds, alternating the order (A B, then B A, ...) to cancel slow
drift of the machine; every round starts a fresh server, sends one warm-up request, then
--reps measured requests. Medians are over all measured requests of a server.

Every request gets a distinct first line ("Sample N."), so no request can reuse the KV cache or
prompt cache of an earlier one and TTFT always includes a full prefill; --same-prompt sends the
identical prompt every time instead (TTFT then measures a prompt-cache hit).

On a shared machine, other processes on the same cores ruin llama.cpp's decode speed. Before
each measured request the driver waits until the rest of the machine uses less than
--idle-threshold CPUs, measures how much CPU other processes used during the request, and repeats
a request during which they used more than --retry-threshold CPUs (up to --max-retries times). Each run records this as `cpu`.

    python scripts/bench_cpu_decode.py [--llama-server build/llama.cpp/bin/llama-server]
        [--model PATH] [--n-predict 256] [--reps 5] [--threads 2] [--rounds 2]

Build llama-server first with scripts/build_llama_server.sh.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

import httpx

if __name__ == "__main__":  # run as a file: the repo root makes the `scripts` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts import bench_common as bc  # noqa: E402
from scripts import cpu_contention  # noqa: E402
from scripts import server_process as sp  # noqa: E402
from scripts.bench_client import stream_request  # noqa: E402

PROMPT = (
    "The lighthouse keeper kept a careful log of every ship that passed the rocky point. "
    "Each morning he climbed the spiral stairs, polished the great lens, and wrote down the "
    "weather, the height of the tide, and the names of the vessels he could read through his "
    "brass telescope. Over forty years the notebooks filled three shelves of his small stone "
    "cottage. When a young historian finally asked to read them, she discovered that the old "
    "man had also recorded something else entirely. Here is the story of what she found:"
)

WARMSLOT = "warmslot"
LLAMA_SERVER = "llama-server"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--llama-server", default=str(sp.DEFAULT_LLAMA_SERVER), help="llama-server binary")
    p.add_argument("--model", "-m", default=None, help="GGUF model (default: the embedded Gemma 3 270M)")
    p.add_argument("--n-predict", type=int, default=256, help="tokens generated per request")
    p.add_argument("--reps", type=int, default=5, help="measured requests per server and round")
    p.add_argument("--rounds", type=int, default=2, help="rounds; the server order alternates between rounds")
    p.add_argument("--threads", "-t", type=int, default=2, help="-t and -tb for both servers")
    p.add_argument("--ctx-size", "-c", type=int, default=4096)
    p.add_argument("--batch-size", "-b", type=int, default=2048)
    p.add_argument("--ubatch-size", "-ub", type=int, default=512)
    p.add_argument("--flash-attn", "-fa", default="auto", choices=("on", "off", "auto"))
    p.add_argument("--same-prompt", action="store_true",
                   help="send the identical prompt every time (TTFT then measures prompt-cache hits)")
    p.add_argument("--pause", type=float, default=0.5, help="seconds to wait between requests")
    p.add_argument("--no-wait-idle", dest="wait_idle", action="store_false",
                   help="do not wait for other processes to go quiet before each request")
    p.add_argument("--idle-threshold", type=float, default=0.15,
                   help="CPUs other processes may use for the machine to count as quiet")
    p.add_argument("--idle-timeout", type=float, default=900.0, help="longest wait for quiet, in seconds")
    p.add_argument("--retry-threshold", type=float, default=0.08,
                   help="repeat a request when other processes used more than this many CPUs during it")
    p.add_argument("--max-retries", type=int, default=3, help="most repeats of one disturbed request")
    p.add_argument("--python", default=sys.executable, help="interpreter that runs warmslot")
    p.add_argument("--warmslot-args", default="", help="extra warmslot flags (one string)")
    p.add_argument("--llama-server-args", default="", help="extra llama-server flags (one string)")
    p.add_argument("--only", choices=(WARMSLOT, LLAMA_SERVER), help="measure one server only")
    p.add_argument("--out", default=str(bc.REPO_ROOT / "docs" / "benchmarks" / "cpu-decode.json"))
    p.add_argument("--log-dir", default=str(bc.REPO_ROOT / "bench-out" / "cpu-decode"),
                   help="server logs are kept here")
    return p.parse_args(argv)


def common_flags(a: argparse.Namespace) -> list[str]:
    return [
        "-np", "1",
        "-c", str(a.ctx_size),
        "-t", str(a.threads),
        "-tb", str(a.threads),
        "-b", str(a.batch_size),
        "-ub", str(a.ubatch_size),
        "-fa", a.flash_attn,
        "-ngl", "0",
    ]


def server_command(name: str, a: argparse.Namespace, model: str) -> list[str]:
    flags = common_flags(a)
    if name == WARMSLOT:
        return sp.warmslot_command(model, [*flags, *a.warmslot_args.split()], python=a.python)
    return sp.llama_server_command(model, [*flags, *a.llama_server_args.split()], binary=a.llama_server)


def request_body(a: argparse.Namespace, index: int) -> dict:
    prompt = PROMPT if a.same_prompt else f"Sample {index}.\n{PROMPT}"
    # Greedy on both servers. top_k=1 makes llama-server's default sampler chain (penalties, dry,
    # top-k 40, typical, top-p, min-p, xtc, temperature, dist) collapse to one candidate right
    # away, so neither server pays for sorting the vocabulary; warmslot samples greedily at
    # temperature 0 anyway.
    return {
        "model": "bench",
        "prompt": prompt,
        "max_tokens": a.n_predict,
        "temperature": 0.0,
        "top_k": 1,
        "top_p": 1.0,
        "min_p": 0.0,
        "seed": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def run_server(name: str, a: argparse.Namespace, model: str, round_no: int) -> dict:
    # Both servers get the same prompts within a round (so their outputs can be compared) and new
    # ones in every round.
    base = round_no * (a.reps + 1)
    cmd = server_command(name, a, model)
    log_path = Path(a.log_dir) / f"{name}-round{round_no}.log"
    print(f"[round {round_no}] starting {name} ...", flush=True)
    runs = []
    with sp.ServerProcess(name, cmd, log_path=log_path) as srv, httpx.Client(timeout=600) as client:
        print(f"[round {round_no}] {name} ready in {srv.load_s:.1f}s", flush=True)
        warm = stream_request(srv.url, "/v1/completions", request_body(a, base), client=client,
                           keep_chunk_times=False)
        if not warm.ok:
            raise RuntimeError(f"{name} warm-up failed ({warm.status}): {warm.error}\n{srv.output_tail()}")
        for rep in range(a.reps):
            attempts = []
            while True:
                time.sleep(a.pause)
                idle = None
                if a.wait_idle:
                    idle = cpu_contention.wait_for_idle([srv.pgid], threshold=a.idle_threshold, timeout=a.idle_timeout,
                                            log=lambda m: print(m, flush=True))
                with cpu_contention.CpuMonitor([srv.pgid]) as cpu:
                    r = stream_request(srv.url, "/v1/completions", request_body(a, base + 1 + rep),
                                       client=client, keep_chunk_times=False)
                if not r.ok:
                    raise RuntimeError(f"{name} request failed ({r.status}): {r.error}\n{srv.output_tail()}")
                foreign = (cpu.result or {}).get("foreign")
                contended = foreign is not None and foreign > a.retry_threshold
                if contended and len(attempts) < a.max_retries:
                    print(f"  {name:12s} rep {rep}: other processes used {foreign:.2f} CPUs during the request "
                          f"({r.decode_tps or 0:.1f} tok/s); repeating it", flush=True)
                    attempts.append({"decode_tps": r.decode_tps, "ttft_s": r.ttft_s, "cpu": cpu.result})
                    continue
                break
            run = {
                "round": round_no,
                "rep": rep,
                "prompt_index": base + 1 + rep,
                "prompt_tokens": r.prompt_tokens,
                "cached_tokens": r.cached_tokens,
                "completion_tokens": r.completion_tokens,
                "token_chunks": r.token_chunks,
                "ttft_s": r.ttft_s,
                "decode_s": r.decode_s,
                "total_s": r.total_s,
                "decode_tps": r.decode_tps,
                "finish_reason": r.finish_reason,
                "server_predicted_per_second": (r.timings or {}).get("predicted_per_second"),
                "server_prompt_per_second": (r.timings or {}).get("prompt_per_second"),
                "server_timings": r.timings,
                "cpu": cpu.result,
                "contended": contended,
                "idle_wait": idle,
                "discarded_attempts": attempts,
                "text_sha1": hashlib.sha1(r.text.encode()).hexdigest(),
                "text_head": r.text[:120],
            }
            runs.append(run)
            srv_tps = run["server_predicted_per_second"]
            print(
                f"  {name:12s} rep {rep}: prompt {r.prompt_tokens} tok, completion {r.completion_tokens} tok, "
                f"TTFT {r.ttft_s * 1000:.0f} ms, decode {r.decode_tps:.1f} tok/s"
                + (f" (server: {srv_tps:.1f})" if srv_tps else "")
                + (f", others used {foreign:.2f} CPUs" if contended else ""),
                flush=True,
            )
            if r.completion_tokens != a.n_predict:
                print(f"  warning: {name} generated {r.completion_tokens} tokens, not {a.n_predict}", flush=True)
        load_s = srv.load_s
    return {"server": name, "round": round_no, "load_s": load_s, "command": cmd, "log": str(log_path),
            "warmup": warm.summary() | {"text": warm.text[:120]}, "runs": runs}


def summarize(name: str, blocks: list[dict]) -> dict:
    runs = [r for b in blocks if b["server"] == name for r in b["runs"]]
    per_round = {}
    for b in blocks:
        if b["server"] == name:
            per_round[str(b["round"])] = {
                "decode_tps_median": bc.stats(r["decode_tps"] for r in b["runs"])["median"],
                "ttft_s_median": bc.stats(r["ttft_s"] for r in b["runs"])["median"],
            }
    return {
        "n_runs": len(runs),
        "n_contended": sum(1 for r in runs if r.get("contended")),
        "foreign_cpus": bc.stats((r.get("cpu") or {}).get("foreign") for r in runs),
        "decode_tps": bc.stats(r["decode_tps"] for r in runs),
        "ttft_s": bc.stats(r["ttft_s"] for r in runs),
        "server_predicted_per_second": bc.stats(r["server_predicted_per_second"] for r in runs),
        "prompt_tokens": bc.stats(r["prompt_tokens"] for r in runs),
        "completion_tokens": bc.stats(r["completion_tokens"] for r in runs),
        "per_round": per_round,
    }


def same_output(blocks: list[dict], servers: list[str]) -> dict | None:
    """How many prompts made both servers generate the identical text (greedy decoding)."""
    if len(servers) < 2:
        return None
    texts: dict[int, dict[str, str]] = {}
    for b in blocks:
        for r in b["runs"]:
            texts.setdefault(r["prompt_index"], {})[b["server"]] = r["text_sha1"]
    pairs = [t for t in texts.values() if len(t) == len(servers)]
    return {"prompts": len(pairs), "identical": sum(1 for t in pairs if len(set(t.values())) == 1)}


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    sp.install_signal_handlers()
    servers = [a.only] if a.only else [WARMSLOT, LLAMA_SERVER]
    if LLAMA_SERVER in servers and not Path(a.llama_server).is_file():
        print(f"llama-server not found at {a.llama_server}; run scripts/build_llama_server.sh first", file=sys.stderr)
        return 2
    model = a.model or bc.default_model()

    started = bc.now_iso()
    blocks: list[dict] = []
    for round_no in range(a.rounds):
        order = servers if round_no % 2 == 0 else list(reversed(servers))
        for name in order:
            blocks.append(run_server(name, a, model, round_no))

    summary = {name: summarize(name, blocks) for name in servers}
    med = {name: summary[name]["decode_tps"]["median"] for name in servers}
    ttft = {name: summary[name]["ttft_s"]["median"] for name in servers}
    result = {
        "benchmark": "cpu-decode",
        "started": started,
        "finished": bc.now_iso(),
        "machine": bc.machine_info(),
        "llama_cpp_python": bc.llama_cpp_python_info(),
        "llama_server": bc.llama_server_build_info(a.llama_server) if LLAMA_SERVER in servers else None,
        "model": bc.file_info(model),
        "settings": {
            "n_predict": a.n_predict,
            "reps": a.reps,
            "rounds": a.rounds,
            "threads": a.threads,
            "threads_batch": a.threads,
            "ctx_size": a.ctx_size,
            "batch_size": a.batch_size,
            "ubatch_size": a.ubatch_size,
            "flash_attn": a.flash_attn,
            "parallel": 1,
            "n_gpu_layers": 0,
            "same_prompt": a.same_prompt,
            "pause_s": a.pause,
            "wait_idle": a.wait_idle,
            "idle_threshold_cpus": a.idle_threshold,
            "retry_threshold_cpus": a.retry_threshold,
            "max_retries": a.max_retries,
            "endpoint": "/v1/completions",
            "request_template": request_body(a, 0) | {"prompt": PROMPT},
            "prompt_prefix": None if a.same_prompt else "Sample {index}.\\n",
            "commands": {b["server"]: b["command"] for b in blocks},
        },
        "method": (
            "one server at a time, rounds in alternating order, one warm-up request per server start; "
            "decode_tps = (completion_tokens - 1) / (t_last_token_chunk - t_first_token_chunk) on the client; "
            "ttft_s = request sent -> first token chunk; medians over all measured requests; "
            "before each request the driver waits until other processes use < idle_threshold CPUs, and "
            "repeats a request (up to max_retries) if they used more than retry_threshold CPUs during it"
        ),
        "summary": summary,
        "ratio_warmslot_over_llama_server": {
            "decode_tps": bc.ratio(med.get(WARMSLOT), med.get(LLAMA_SERVER)),
            "ttft_s": bc.ratio(ttft.get(WARMSLOT), ttft.get(LLAMA_SERVER)),
        },
        "same_output": same_output(blocks, servers),
        "runs": blocks,
    }
    out = bc.write_json(a.out, result)

    rows = []
    for b in blocks:
        s = bc.stats(r["decode_tps"] for r in b["runs"])
        rows.append([
            b["server"], b["round"],
            bc.stats(r["prompt_tokens"] for r in b["runs"])["median"],
            bc.stats(r["completion_tokens"] for r in b["runs"])["median"],
            (bc.stats(r["ttft_s"] for r in b["runs"])["median"] or 0) * 1000,
            s["median"], s["min"], s["max"],
            bc.stats(r["server_predicted_per_second"] for r in b["runs"])["median"],
        ])
    for name in servers:
        s = summary[name]
        rows.append([name, "all", s["prompt_tokens"]["median"], s["completion_tokens"]["median"],
                     (s["ttft_s"]["median"] or 0) * 1000, s["decode_tps"]["median"], s["decode_tps"]["min"],
                     s["decode_tps"]["max"], s["server_predicted_per_second"]["median"]])
    print()
    print(f"model {Path(model).name}, {a.n_predict} tokens, -t {a.threads}, {a.reps} reps x {a.rounds} rounds, "
          f"medians")
    print(bc.format_table(
        ["server", "round", "prompt", "gen", "TTFT ms", "tok/s", "min", "max", "srv tok/s"], rows))
    r = result["ratio_warmslot_over_llama_server"]
    if r["decode_tps"] is not None:
        print(f"\nwarmslot / llama-server: decode {r['decode_tps']:.3f}x, TTFT {r['ttft_s']:.3f}x")
    if result["same_output"]:
        so = result["same_output"]
        print(f"identical generated text on {so['identical']} of {so['prompts']} prompts")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
