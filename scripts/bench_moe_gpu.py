#!/usr/bin/env python3
"""Expert offload and --fit on a real GPU: what --fit chooses on a smaller card, where the
experts go, and decode speed with and without --cpu-moe.

A ballast process (PyTorch, a separate interpreter) holds all but `--card-gib` of the GPU's
free memory, so --fit faces a card of that size. Each scenario loads the engine in a fresh
process (`--scenario JSON`), so the GPU is empty between them, and reports the capacity
table (weights by device, what --fit chose, what the server can hold), the load time and the
decode speed of one greedy request (512 prompt tokens, 128 generated). llama-server's own
`--fit` on the same card is recorded from its log when the binary is on PATH.

Usage (on the GPU machine, after `source .gpu/device-env.sh`):
    python scripts/bench_moe_gpu.py --model /tmp/models/qwen3-30b-a3b.gguf --out bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
GIB = 1 << 30

BALLAST = """
import sys, time, torch
free, total = torch.cuda.mem_get_info()
keep = int(float(sys.argv[1]) * (1 << 30))
x = torch.empty(max(0, free - keep), dtype=torch.uint8, device="cuda")
print("ballast", x.numel(), "of", free, flush=True)
time.sleep(3600)
"""

SCENARIOS = [
    # (name, card GiB (None: the whole card), --parallel, --ctx-size, --cpu-moe)
    ("fit-24gib-np3", 24, 3, 0, False),
    ("fit-24gib-np5", 24, 5, 0, False),
    ("fit-16gib-np3", 16, 3, 0, False),
    ("all-on-gpu-c16k", None, 1, 16384, False),
    ("cpu-moe-c16k", None, 1, 16384, True),
]


def scenario(spec: dict) -> dict:
    """One engine load and one timed request, in this process."""
    import llama_cpp  # noqa: F401  (before numpy)

    from warmslot.slots import Engine, EngineConfig, GenerateRequest, NotReady, Placement, QueueSink, SamplingParams, placement

    overrides = placement.expert_overrides(None) if spec["cpu_moe"] else ()
    cfg = EngineConfig(
        model_path=spec["model"], n_parallel=spec["np"], n_ctx=spec["ctx"], n_gpu_layers=-1, n_gpu_layers_auto=True,
        fit=True, fit_target=1024 << 20, cache_ram=4 << 30, placement=Placement(tensor_overrides=overrides),
    )
    t0 = time.perf_counter()
    engine = Engine(cfg)
    engine.start()
    try:
        engine.wait_ready(600)
    except NotReady as exc:
        return {"error": str(exc), "load_s": time.perf_counter() - t0}
    load_s = time.perf_counter() - t0
    try:
        import numpy as np

        hi = min(100000, engine.info.n_vocab // 2)  # plain tokens of the Qwen vocabulary
        prompt = [int(t) for t in np.random.default_rng(0).integers(hi // 100, hi, 512)]
        sink = QueueSink()
        engine.submit(GenerateRequest("bench", prompt, sink, SamplingParams(temperature=0.0), max_tokens=128))
        result = sink.collect()
        usage = result.usage
        cap = engine.info.capacity
        return {
            "load_s": round(load_s, 2),
            "table": cap.table(),
            "capacity": cap.to_json(),
            "n_ctx": engine.info.n_ctx,
            "prompt_tokens": usage.prompt_tokens,
            "prefill_tok_s": round(usage.prompt_tokens / usage.prefill_s, 1) if usage.prefill_s else None,
            "completion_tokens": usage.completion_tokens,
            "decode_tok_s": round((usage.completion_tokens - 1) / usage.decode_s, 1) if usage.decode_s else None,
            "error": str(result.error) if result.error else None,
        }
    finally:
        engine.stop()


class Ballast:
    """A process holding all but `card_gib` GiB of the GPU's free memory (None: nothing)."""

    def __init__(self, card_gib: float | None):
        self.proc = None
        self.line = None
        if card_gib is None:
            return
        # a card of N GB shows about N - 0.5 GiB free once a driver context exists
        self.proc = subprocess.Popen([sys.executable, "-c", BALLAST, str(card_gib - 0.5)], stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("ballast"):
            raise RuntimeError(f"ballast failed: {line!r}")
        self.line = line.strip()
        print(f"[bench_moe] {self.line}", flush=True)

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            time.sleep(1.0)


def run_child(spec: dict) -> dict:
    done = subprocess.run([sys.executable, __file__, "--scenario", json.dumps(spec)], capture_output=True, text=True, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"error": f"exit {done.returncode}", "stderr_tail": done.stderr[-3000:]}
    return json.loads(lines[-1])


def llama_server_fit(model: str, n_parallel: int, log_path: pathlib.Path) -> dict:
    """llama-server's own --fit on the same card: the lines of its log that say what it chose."""
    exe = shutil.which("llama-server")
    if exe is None:
        return {"error": "no llama-server on PATH"}
    helps = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60).stdout
    if "--fit" not in helps:
        return {"error": "this llama-server has no --fit"}
    proc = subprocess.Popen([exe, "-m", model, "-np", str(n_parallel), "--fit", "on", "--port", "18099", "-fa", "auto"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, t0 = [], time.monotonic()
    try:
        for line in proc.stdout:
            lines.append(line.rstrip())
            if "listening" in line or "error" in line.lower() and "loading" in line or time.monotonic() - t0 > 240:
                break
    finally:
        proc.kill()
        proc.wait()
    log_path.write_text("\n".join(lines))
    keep = re.compile(r"fit|n_ctx|n_seq|offload|CUDA0 model|CPU_Mapped model|KV buffer|n_gpu_layers|exps", re.IGNORECASE)
    return {"load_s": round(time.monotonic() - t0, 1), "log": [line for line in lines if keep.search(line)][:80]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model")
    ap.add_argument("--out")
    ap.add_argument("--scenario", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.scenario:
        print(json.dumps(scenario(json.loads(args.scenario))), flush=True)
        return 0
    card = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                          capture_output=True, text=True).stdout.strip()
    report = {"card": card, "model": os.path.basename(args.model), "model_bytes": os.path.getsize(args.model),
              "scenarios": {}, "llama_server_fit": {}}
    for name, card_gib, n_parallel, ctx, cpu_moe in SCENARIOS:
        ballast = Ballast(card_gib)
        try:
            spec = {"model": args.model, "np": n_parallel, "ctx": ctx, "cpu_moe": cpu_moe}
            result = run_child(spec)
            if card_gib == 24 and n_parallel == 3:
                report["llama_server_fit"][name] = llama_server_fit(
                    args.model, n_parallel, pathlib.Path(args.out).with_name(f"llama-server-{name}.log"))
                printed = subprocess.run([sys.executable, "-m", "warmslot.server", "-m", args.model, "-np", "3", "--fit-print"],
                                         capture_output=True, text=True, timeout=600)
                report["fit_print_cli"] = {"returncode": printed.returncode, "stdout": printed.stdout,
                                           "stderr_tail": printed.stderr[-2000:]}
        finally:
            ballast.close()
        result |= {"card_gib": card_gib, "np": n_parallel, "ctx_flag": ctx, "cpu_moe": cpu_moe}
        report["scenarios"][name] = result
        print(f"[bench_moe] {name}: " + json.dumps({k: v for k, v in result.items() if k not in ("capacity", "table")}), flush=True)
        print(result.get("table", result.get("stderr_tail", "")), flush=True)
        pathlib.Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
