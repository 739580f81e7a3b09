#!/usr/bin/env python3
"""An editor's code completion, server against server: what `--cache-reuse` saves on
warmslot and on llama-server, with the same model, requests and settings.

The workload is what llama.vscode sends to `POST /infill` while someone edits a file:
- `input_extra`: a ring buffer of chunks (`--chunk-lines` lines each) taken from other
  files; every `--ring-every` completions a chunk of another file is pushed, and once the
  ring holds `--ring-chunks` the oldest is dropped (what precedes everything else in the
  prompt moves: the case chunk shifting is for). As llama.vscode does, each ring update is
  followed by a request with `n_predict` 0 that only evaluates the new extra context;
- `input_prefix`: the `--prefix-lines` lines above the cursor, `prompt`: the cursor's line
  up to the cursor, `input_suffix`: the `--suffix-lines` lines below it. The cursor walks up
  and down the file (a seeded random walk of 1-3 lines), so lines leave the top of the prefix
  and the suffix changes; now and then it types on its line instead.

Configurations, each on a fresh server, one after another: warmslot and llama-server, each
without and with `--cache-reuse N`. Per configuration: prompt tokens, tokens computed, tokens
reused (the servers' `cache_n`: the exact prefix and, with the flag, the shifted chunks),
tokens shifted (warmslot says it: `tokens_shifted`; llama-server counts its shifted chunks in
`cache_n` without telling them apart), requests whose reply equals the same server's reply
without the flag (the approximation at work), and wall time.

    python scripts/bench_editor_cache_reuse.py --make-model qwen3-0.6b --out OUT_DIR
    python scripts/bench_editor_cache_reuse.py -m code-model.gguf --ngl 99 --out OUT_DIR

`--make-model NAME` writes a random-weight model of that shape (scripts/bench_models.py)
on deepseek-coder's vocabulary, which has FIM tokens, into --model-dir (kept there for the
next run); `--scale tiny` makes it small enough for a CPU smoke test. Results:
OUT_DIR/editor_cache_reuse.json (each request's numbers and the totals), server logs beside.
"""

from __future__ import annotations

import argparse
import random
import shlex
import sys
import time
from pathlib import Path

import httpx

if __name__ == "__main__":  # run as a file: the repo root makes the `scripts` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts import bench_common as bc  # noqa: E402
from scripts import server_process as sp  # noqa: E402

# deepseek-coder's vocabulary (FIM prefix, suffix and middle tokens), from the pinned sdist
FIM_VOCAB = ("ggml-vocab-deepseek-coder.gguf", "91cb1379f2e33af1c4866b194622b7a0e12e8f0c9dba7ba2f10d55978730bec1")

NAMES = ("alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta")


def source_file(seed: int, n_lines: int) -> list[str]:
    """A deterministic Python file of `n_lines` lines (a class of short methods)."""
    rng = random.Random(seed)
    lines = [f"class Module{seed}:", f'    """Helpers of module {seed}."""', ""]
    while len(lines) < n_lines:
        a, b = rng.choice(NAMES), rng.choice(NAMES)
        k = len(lines)
        lines += [
            f"    def {a}_{b}_{k}(self, {a}: int, {b}: int) -> int:",
            f"        total = {a} * {rng.randint(2, 99)} + {b}",
            f"        if total > {rng.randint(100, 9999)}:",
            f"            return total - self.offset_{k % 7}",
            f"        return total // {rng.randint(2, 9)}",
            "",
        ]
    return lines[:n_lines]


class Editor:
    """The state of the editor the requests come from (see the module docstring)."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.rng = random.Random(a.seed)
        self.files = {f"src/module_{i}.py": source_file(i, a.file_lines) for i in range(a.files)}
        self.current = "src/module_0.py"
        self.lines = list(self.files.pop(self.current))
        self.cursor = min(len(self.lines) - 1, a.prefix_lines + 10)
        self.column = 8
        self.ring: list[dict] = []
        self.queued = [(name, start) for start in range(0, a.file_lines - a.chunk_lines + 1, a.chunk_lines)
                       for name in self.files]
        self.rng.shuffle(self.queued)

    def push_chunk(self) -> None:
        name, start = self.queued.pop(0)
        self.queued.append((name, start))
        self.ring.append({"filename": name, "text": "\n".join(self.files[name][start : start + self.a.chunk_lines]) + "\n"})
        del self.ring[: max(0, len(self.ring) - self.a.ring_chunks)]

    def move(self) -> None:
        if self.rng.random() < 0.3:  # types on its line
            self.lines[self.cursor] = self.lines[self.cursor][: self.column] + "x" + self.lines[self.cursor][self.column :]
            self.column += 1
            return
        step = self.rng.choice((-3, -2, -1, 1, 2, 3))
        self.cursor = max(1, min(len(self.lines) - 2, self.cursor + step))
        self.column = min(len(self.lines[self.cursor]), 8)

    def body(self, n_predict: int) -> dict:
        line = self.lines[self.cursor]
        top = max(0, self.cursor - self.a.prefix_lines)
        return {
            "input_extra": list(self.ring),
            "input_prefix": "".join(s + "\n" for s in self.lines[top : self.cursor]),
            "prompt": line[: self.column],
            "input_suffix": line[self.column :] + "\n" + "".join(s + "\n" for s in self.lines[self.cursor + 1 : self.cursor + 1 + self.a.suffix_lines]),
            "n_predict": n_predict, "cache_prompt": True, "temperature": 0, "top_k": 40, "top_p": 0.99,
            "t_max_predict_ms": 1000,
        }


def workload(a: argparse.Namespace) -> list[tuple[str, dict]]:
    """The requests, in order: ("ring", body) after each ring update, ("complete", body) else."""
    editor, out = Editor(a), []
    for _ in range(a.ring_chunks // 2):  # the files open at the start
        editor.push_chunk()
    for i in range(a.requests):
        if i and i % a.ring_every == 0:
            editor.push_chunk()
            out.append(("ring", {**editor.body(0), "input_prefix": "", "prompt": "", "input_suffix": ""}))
        editor.move()
        out.append(("complete", editor.body(a.n_predict)))
    return out


def numbers(reply: dict) -> dict:
    """A reply's token counts, read the same way from both servers."""
    t = reply.get("timings") or {}
    prompt = int(reply.get("tokens_evaluated") or 0)
    cached = int(t.get("cache_n", reply.get("tokens_cached") or 0))
    return {"prompt": prompt, "cached": cached, "computed": int(t.get("prompt_n", prompt - cached)),
            "shifted": reply.get("tokens_shifted"), "content": reply.get("content", "")}


def run_config(name: str, server: str, flags: list[str], a: argparse.Namespace, model: str, requests: list) -> dict:
    common = ["-np", "1", "-c", str(a.ctx_size), "-b", str(a.batch), "-t", str(a.threads), "-ngl", str(a.ngl), *shlex.split(a.flags)]
    if server == "warmslot":
        cmd = sp.warmslot_command(model, [*common, *flags], python=a.python)
    else:
        cmd = sp.llama_server_command(model, [*common, *flags], binary=a.llama_server)
    rows = []
    with sp.ServerProcess(name, cmd, log_path=Path(a.out) / f"{name}.log") as srv, httpx.Client(timeout=600) as client:
        t0 = time.perf_counter()
        for kind, body in requests:
            t = time.perf_counter()
            r = client.post(srv.url + "/infill", json=body)
            r.raise_for_status()
            rows.append({"kind": kind, **numbers(r.json()), "seconds": round(time.perf_counter() - t, 4)})
        wall = time.perf_counter() - t0
    total = {k: sum(r[k] for r in rows) for k in ("prompt", "cached", "computed")}
    shifted = [r["shifted"] for r in rows]
    total["shifted"] = sum(shifted) if all(s is not None for s in shifted) else None
    total["exact"] = total["cached"] - total["shifted"] if total["shifted"] is not None else (None if flags else total["cached"])
    return {"server": server, "flags": flags, "command": cmd, "wall_s": round(wall, 3),
            "latency_s": bc.stats(r["seconds"] for r in rows if r["kind"] == "complete"), "totals": total, "requests": rows}


def make_model(a: argparse.Namespace) -> str:
    from scripts.bench_models import write_bench_model
    from scripts.vocab import llama_cpp_file, sdist_files

    vocab = a.vocab or sdist_files([llama_cpp_file(*FIM_VOCAB)])[0]
    out = Path(a.model_dir) / f"{a.make_model}-{a.scale}-fim.gguf"
    return str(write_bench_model(a.make_model, out, vocab, scale=a.scale))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", "-m", default=None, help="a GGUF with FIM tokens")
    p.add_argument("--make-model", default=None, help="else: write this bench_models.py shape on deepseek-coder's vocabulary")
    p.add_argument("--scale", default="real", help="its scale (real, tiny)")
    p.add_argument("--vocab", default=None, help="its vocabulary: a vocab-only GGUF with FIM tokens (default: deepseek-coder's)")
    p.add_argument("--model-dir", default="/tmp/warmslot-bench-models", help="where a made model is written (and kept)")
    p.add_argument("--llama-server", default=None, help="the binary (default: on PATH, else build/llama.cpp/bin)")
    p.add_argument("--python", default=sys.executable, help="interpreter that runs warmslot")
    p.add_argument("--servers", default="warmslot,llama-server")
    p.add_argument("--cache-reuse", type=int, default=256, help="N of the runs with the flag")
    p.add_argument("--requests", type=int, default=48, help="completions (ring updates come on top)")
    p.add_argument("--n-predict", type=int, default=16)
    p.add_argument("--files", type=int, default=6)
    p.add_argument("--file-lines", type=int, default=512)
    p.add_argument("--ring-chunks", type=int, default=16)
    p.add_argument("--chunk-lines", type=int, default=64)
    p.add_argument("--ring-every", type=int, default=4, help="completions between ring updates")
    p.add_argument("--prefix-lines", type=int, default=256)
    p.add_argument("--suffix-lines", type=int, default=64)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--ctx-size", "-c", type=int, default=32768)
    p.add_argument("--batch", "-b", type=int, default=2048)
    p.add_argument("--threads", "-t", type=int, default=4)
    p.add_argument("--ngl", type=int, default=0)
    p.add_argument("--flags", default="", help="more flags for every server")
    p.add_argument("--out", required=True, help="folder for the JSON and the server logs")
    a = p.parse_args(argv)
    if (a.model is None) == (a.make_model is None):
        p.error("give --model or --make-model")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    sp.install_signal_handlers()
    Path(a.out).mkdir(parents=True, exist_ok=True)
    model = a.model or make_model(a)
    servers = a.servers.split(",")
    if "llama-server" in servers:
        found = bc.find_llama_server(a.llama_server)
        if found is None:
            print("no llama-server binary (--llama-server, PATH or build/llama.cpp/bin)", file=sys.stderr)
            return 1
        a.llama_server = str(found)
    requests = workload(a)
    results = {}
    for server in servers:
        for flags in ([], ["--cache-reuse", str(a.cache_reuse)]):
            name = f"{server}-{'reuse' if flags else 'off'}"
            print(f"{name}: {len(requests)} requests", flush=True)
            results[name] = run_config(name, server, flags, a, model, requests)
    for server in servers:
        off, on = results[f"{server}-off"]["requests"], results[f"{server}-reuse"]["requests"]
        same = sum(x["content"] == y["content"] for x, y in zip(off, on) if x["kind"] == "complete")
        results[f"{server}-reuse"]["same_reply_as_off"] = f"{same}/{sum(r['kind'] == 'complete' for r in off)}"
    rows = [(name, r["totals"]["prompt"], r["totals"]["computed"], r["totals"]["exact"], r["totals"]["shifted"],
             r["totals"]["cached"], r.get("same_reply_as_off"), r["wall_s"]) for name, r in results.items()]
    print(bc.format_table(("config", "prompt", "computed", "exact", "shifted", "cached", "same reply", "wall s"), rows))
    report = {"when": bc.now_iso(), "machine": bc.machine_info(), "commit": bc.git_commit(), "model": bc.file_info(model),
              "llama_server": bc.llama_server_build_info(a.llama_server) if a.llama_server else None,
              "args": vars(a), "results": results}
    print("wrote", bc.write_json(Path(a.out) / "editor_cache_reuse.json", report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
