#!/usr/bin/env python3
"""Speculative decoding, server against server: decode tokens/s of warmslot and llama-server,
with and without drafts, on the same model, prompts and settings.

Workloads, each a chat request of its own (a distinct first line, so nothing is reused between
requests), streamed:
- `rewrite`: a ~900-token Python file, then "write the whole file back with one change",
  greedy (copy-heavy: n-gram drafts run along the copy);
- `quote`: a build log as a tool's result, then "show me the build output above exactly as
  it is", greedy (copy-heavy);
- `free`: a short story at temperature 0.8 with a fixed seed, `ignore_eos` (little to accept:
  the cost of drafting when the drafts are rejected).

Configurations are NAME=SERVER[:FLAGS] (SERVER warmslot or llama-server), each started fresh,
one server at a time, with the same `-np P -c N*P -t T` flags (P: --parallel, 1 by default; with
more, each repetition sends P requests at once and the aggregate tokens/s is reported too).
The default compares warmslot off
and `ngram-simple` with llama-server off and every one of its n-gram types, each at its own
defaults:

    python scripts/bench_spec_servers.py [--model PATH] [--reps 3] --out OUT.json
    python scripts/bench_spec_servers.py -m target.gguf --ngl 99 \
        --config ws-off=warmslot --config ws-md=warmslot:"-md draft.gguf" \
        --config ls-off=llama-server --config ls-md=llama-server:"-md draft.gguf"

Decode speed is (completion_tokens - 1) / (last token - first token) of the stream; drafted
and accepted counts come from each server's `timings` (draft_n, draft_n_accepted). Each
configuration's greedy outputs are compared with its server's output without drafts. On a
shared machine each request waits until other processes are quiet (scripts/cpu_contention.py).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import shlex
import statistics
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
from scripts.bench_spec import source_file  # noqa: E402

WORKLOADS = ("rewrite", "quote", "free")
LLAMA_NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
DEFAULT_CONFIGS = (
    "warmslot-off=warmslot",
    "warmslot-ngram-simple=warmslot:--spec-type ngram-simple",
    "llama-server-off=llama-server",
    *(f"llama-server-{t}=llama-server:--spec-type {t}" for t in LLAMA_NGRAM_TYPES),
)


def tool_log(i: int, lines: int = 40) -> str:
    """A deterministic build log (about 20 tokens a line)."""
    out = []
    for n in range(lines):
        level = "ERROR" if n == 27 else "INFO"
        out.append(f"2026-03-0{1 + n % 9}T12:{n:02d}:07Z {level} worker-{n % 4} compiled module_{n}.py "
                   f"in {(n * 37) % 900 + 100} ms ({n * 3 + i} warnings)")
    return "\n".join(out)


def messages(workload: str, i: int) -> list[dict]:
    if workload == "rewrite":
        return [{"role": "user", "content": (
            f"Request {i}.\nHere is a file, geometry.py:\n```python\n{source_file(24)}```\n"
            "Write the whole file back with one change: rename `depth` to `length`. Output only the file.")}]
    if workload == "quote":
        return [
            {"role": "user", "content": f"Request {i}. Run the build and show me its output."},
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": "call_1", "type": "function", "function": {"name": "run_build", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": tool_log(i)},
            {"role": "user", "content": "Show me the build output above exactly as it is, line by line."},
        ]
    return [{"role": "user", "content": f"Request {i}. Write a long story about a lighthouse keeper and the ships he logged."}]


def request_body(workload: str, i: int, n_predict: int) -> dict:
    body = {"model": "bench", "messages": messages(workload, i), "max_tokens": n_predict,
            "stream_options": {"include_usage": True}}
    if workload == "free":
        return {**body, "temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "seed": i, "ignore_eos": True}
    # greedy; top_k 1 collapses llama-server's default chain to one candidate at once
    return {**body, "temperature": 0.0, "top_k": 1, "top_p": 1.0, "min_p": 0.0, "seed": 0}


def parse_config(text: str) -> tuple[str, str, list[str]]:
    name, _, rest = text.partition("=")
    server, _, flags = rest.partition(":")
    if server not in ("warmslot", "llama-server") or not name:
        raise SystemExit(f"--config {text!r}: NAME=warmslot[:FLAGS] or NAME=llama-server[:FLAGS]")
    return name, server, shlex.split(flags)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", "-m", default=None, help="GGUF model (default: warmslot's embedded default model)")
    p.add_argument("--llama-server", default=str(sp.DEFAULT_LLAMA_SERVER))
    p.add_argument("--python", default=sys.executable, help="interpreter that runs warmslot")
    p.add_argument("--config", action="append", default=None, help="NAME=SERVER[:FLAGS], repeated")
    p.add_argument("--src", action="append", default=[], help="NAME=DIR: run that warmslot configuration from DIR (a `warmslot` package)")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--reps", type=int, default=3, help="measured requests per workload and configuration")
    p.add_argument("--n-predict", type=int, default=384, help="most tokens per request (free: exactly this many)")
    p.add_argument("--threads", "-t", type=int, default=2)
    p.add_argument("--ctx-size", "-c", type=int, default=4096, help="per slot")
    p.add_argument("--parallel", type=int, default=1,
                   help="slots (-np), and requests sent at once in each repetition (aggregate tokens/s then reported)")
    p.add_argument("--ngl", type=int, default=0, help="-ngl for both servers")
    p.add_argument("--chat-template-file", default=None)
    p.add_argument("--no-wait-idle", dest="wait_idle", action="store_false")
    p.add_argument("--out", required=True)
    p.add_argument("--log-dir", default=str(bc.REPO_ROOT / "bench-out" / "spec-servers"))
    return p.parse_args(argv)


def server_command(server: str, flags: list[str], a: argparse.Namespace, model: str) -> list[str]:
    common = ["-np", str(a.parallel), "-c", str(a.ctx_size * a.parallel), "-t", str(a.threads), "-tb", str(a.threads), "-ngl", str(a.ngl)]
    if a.chat_template_file:
        common += ["--chat-template-file", a.chat_template_file]
    if server == "warmslot":
        return sp.warmslot_command(model, [*common, *flags], python=a.python)
    return sp.llama_server_command(model, [*common, "--jinja", *flags], binary=a.llama_server)


def drafts(timings: dict | None) -> tuple[int, int]:
    t = timings or {}
    return int(t.get("draft_n") or 0), int(t.get("draft_n_accepted") or 0)


def pinned_settled(url: str, client: httpx.Client, timeout: float = 60.0) -> float:
    """Wait until a warmslot server's pinned host memory stops growing (on a GPU it pins in
    the background once it serves, and each pinning call holds the CUDA driver a moment):
    the decode speeds below are then those of a server that has settled. Seconds waited."""
    t0 = time.perf_counter()
    last = None
    while time.perf_counter() - t0 < timeout:
        engine = client.get(url + "/engine").json()
        pinned, limit = engine.get("pinned_bytes", 0), (engine.get("capacity") or {}).get("pinned_limit_bytes", 0)
        if not limit or (pinned == last and pinned > 0):
            break
        last = pinned
        time.sleep(3.0)  # longer than one pinning call (a 4 GiB chunk: 2.5 s on an H200 host)
    return round(time.perf_counter() - t0, 1)


def run_config(name: str, server: str, flags: list[str], a: argparse.Namespace, model: str, workloads: list[str]) -> dict:
    cmd = server_command(server, flags, a, model)
    out: dict = {"server": server, "flags": flags, "command": cmd, "workloads": {}}
    print(f"[{name}] starting: {shlex.join(cmd)}", flush=True)
    env = sp.source_env(dict(s.split("=", 1) for s in a.src).get(name))  # another source tree for it
    with sp.ServerProcess(name, cmd, env=env, log_path=Path(a.log_dir) / f"{name}.log") as srv, httpx.Client(timeout=900) as client:
        out["load_s"] = srv.load_s
        warm = stream_request(srv.url, "/v1/chat/completions", request_body("free", 999, 8), client=client)
        if not warm.ok:
            raise RuntimeError(f"{name}: warm-up failed: {warm.error}\n{srv.output_tail()}")
        if server == "warmslot":
            out["pinned_wait_s"] = pinned_settled(srv.url, client)
        for wl in workloads:
            runs, aggregate = [], []
            for i in range(a.reps):
                if a.wait_idle:
                    cpu_contention.wait_for_idle([srv.pgid], timeout=600)
                t0 = time.perf_counter()
                with concurrent.futures.ThreadPoolExecutor(a.parallel) as pool:
                    results = list(pool.map(
                        lambda j: stream_request(srv.url, "/v1/chat/completions",
                                                 request_body(wl, i * a.parallel + j, a.n_predict), client=client),
                        range(a.parallel)))
                aggregate.append(sum(r.completion_tokens or 0 for r in results) / (time.perf_counter() - t0))
                for r in results:
                    if not r.ok:
                        raise RuntimeError(f"{name} {wl}: {r.error}\n{srv.output_tail()}")
                    drafted, accepted = drafts(r.timings)
                    runs.append({"prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens,
                                 "ttft_s": r.ttft_s, "decode_s": r.decode_s, "decode_tps": r.decode_tps,
                                 "drafted": drafted, "accepted": accepted, "finish_reason": r.finish_reason,
                                 "text_sha1": hashlib.sha1(r.text.encode()).hexdigest()[:12], "text_head": r.text[:80]})
                    print(f"  {name:28s} {wl:8s} {i}: {r.completion_tokens} tokens, {r.decode_tps or 0:7.1f} tok/s, "
                          f"drafted {drafted} accepted {accepted}", flush=True)
            drafted = sum(r["drafted"] for r in runs)
            out["workloads"][wl] = {
                "aggregate_tps": statistics.median(aggregate) if a.parallel > 1 else None,
                "decode_tps": statistics.median(r["decode_tps"] or 0.0 for r in runs),
                "completion_tokens": sum(r["completion_tokens"] or 0 for r in runs),
                "drafted": drafted, "accepted": sum(r["accepted"] for r in runs),
                "acceptance": sum(r["accepted"] for r in runs) / drafted if drafted else None,
                "runs": runs,
            }
        if server == "warmslot":  # where the engine's time went: steps, llama_decode calls, device waits, drafts
            metrics = bc.parse_prometheus(client.get(srv.url + "/metrics").text)
            out["engine_counters"] = {k: v for k, v in metrics.items() if k.startswith((
                "warmslot_engine_", "warmslot_spec_", "warmslot_decode_", "llamacpp:n_decode_total"))}
    return out


def summarize(results: dict) -> dict:
    """Each configuration's decode speed as a multiple of its own server without drafts, and
    whether its greedy outputs are the same as there."""
    base = {}
    for name, r in results.items():
        if not any(f.startswith("--spec-type") or f in ("-md", "--model-draft") for f in r["flags"]):
            base.setdefault(r["server"], name)
    summary = {}
    for name, r in results.items():
        ref = results.get(base.get(r["server"], ""))
        row = {}
        for wl, w in r["workloads"].items():
            entry = {"decode_tps": round(w["decode_tps"], 1), "acceptance": w["acceptance"]}
            if w.get("aggregate_tps"):
                entry["aggregate_tps"] = round(w["aggregate_tps"], 1)
            if ref and wl in ref["workloads"] and ref["workloads"][wl]["decode_tps"]:
                entry["vs_own_off"] = round(w["decode_tps"] / ref["workloads"][wl]["decode_tps"], 3)
                if wl != "free":
                    entry["same_output_as_off"] = [x["text_sha1"] for x in w["runs"]] == [
                        x["text_sha1"] for x in ref["workloads"][wl]["runs"]]
            row[wl] = entry
        summary[name] = row
    return summary


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    sp.install_signal_handlers()
    if a.model is None:  # the server's own default: SmolLM2 135M Instruct when installed
        from warmslot.server.process.cli import default_model_path

        a.model = default_model_path() or bc.default_model()
    model = a.model
    workloads = [w for w in a.workloads.split(",") if w]
    configs = [parse_config(c) for c in (a.config or DEFAULT_CONFIGS)]
    t0 = time.monotonic()
    started = bc.now_iso()
    results, errors = {}, {}
    for name, server, flags in configs:
        try:
            results[name] = run_config(name, server, flags, a, model, workloads)
        except Exception as exc:  # one configuration that fails to start or answer: the others still run
            errors[name] = f"{type(exc).__name__}: {exc}"[-2000:]
            print(f"[{name}] failed: {errors[name]}", flush=True)
    summary = summarize(results)
    out = {
        "benchmark": "speculative decoding, warmslot and llama-server",
        "started": started, "finished": bc.now_iso(), "seconds": round(time.monotonic() - t0, 1),
        "machine": bc.machine_info(),
        "llama_server": bc.llama_server_build_info(a.llama_server),
        "model": bc.file_info(model),
        "settings": {k: v for k, v in vars(a).items() if k not in ("out", "log_dir")},
        "summary": summary,
        "errors": errors,
        "results": results,
    }
    bc.write_json(a.out, out)
    rows = [(name, *(f"{s[wl].get('aggregate_tps', s[wl]['decode_tps']):.1f} ({s[wl].get('vs_own_off', 1.0):.2f}x, "
                     f"{(s[wl]['acceptance'] or 0):.0%})" for wl in workloads)) for name, s in summary.items()]
    print(bc.format_table(["config", *workloads], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
