#!/usr/bin/env python3
"""Returning conversations with a draft model: what a turn costs when the conversation comes
back from the prompt cache.

Two or more conversations alternate on one slot (`-np 1`), each opened with a long document
(a Python file of `--functions` functions) and then asked short follow-ups, greedy,
`--n-predict` tokens a turn, with `ignore_eos`. So every turn after the first of each
conversation finds another conversation in the slot and takes its own back from the cache:
the target's state, and the draft model's sequence where the server keeps it. Where it does
not, the draft model evaluates the whole history again before its first draft.

Configurations are NAME=SERVER[:FLAGS] as in bench_spec_servers.py, each started fresh with
`-np 1 -c N -t T -ngl L`; `--src NAME=DIR` runs that warmslot configuration from another
source tree (DIR holds a `warmslot` package), to compare two versions in one run. Per turn:
wall time, time to the first token and to the second (the first draft runs before the
second token), and for warmslot the draft model's tokens by source
(`warmslot_spec_drafter_tokens_total`, absent in versions without it).

    python scripts/bench_draft_return.py -m target.gguf -md draft.gguf --ngl 99 \\
        --config ws=warmslot --config ls=llama-server --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

if __name__ == "__main__":  # run as a file: the repo root makes the `scripts` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts import bench_common as bc  # noqa: E402
from scripts import server_process as sp  # noqa: E402
from scripts.bench_spec import source_file  # noqa: E402
from scripts.bench_spec_servers import parse_config  # noqa: E402

FOLLOW_UPS = (
    "Which function returns the largest value for width 3 and height 4? Answer briefly.",
    "Write a docstring for the third function.",
    "Suggest a better name for the module.",
    "List three functions that could share a helper.",
    "What would a test for the first function check?",
    "Summarise the file in one sentence.",
)


def drafter_tokens(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=30).text):
        for s in family.samples:
            if s.name == "warmslot_spec_drafter_tokens_total":
                out[s.labels["source"]] = s.value
    return out


def turn(client: httpx.Client, url: str, messages: list[dict], n: int) -> dict:
    body = {"model": "bench", "messages": messages, "max_tokens": n, "temperature": 0.0, "top_k": 1,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    times, text, usage, timings = [], [], {}, {}
    with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            timings = chunk.get("timings") or timings
            for choice in chunk.get("choices", []):
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    times.append(time.perf_counter() - t0)
                    text.append(piece)
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    return {"wall_s": time.perf_counter() - t0, "ttft_s": times[0] if times else None,
            "second_token_s": times[1] if len(times) > 1 else None, "prompt_tokens": usage.get("prompt_tokens"),
            "cached_tokens": cached, "completion_tokens": usage.get("completion_tokens"), "text": "".join(text),
            "drafted": timings.get("draft_n"), "accepted": timings.get("draft_n_accepted")}


def run_config(name: str, server: str, flags: list[str], a: argparse.Namespace, src: str | None) -> dict:
    common = ["-np", "1", "-c", str(a.ctx_size), "-t", str(a.threads), "-ngl", str(a.ngl), "-md", a.draft, *flags]
    if a.chat_template_file:
        common += ["--chat-template-file", a.chat_template_file]
    if server == "warmslot":
        cmd = sp.warmslot_command(a.model, common, python=a.python)
    else:
        cmd = sp.llama_server_command(a.model, ["--jinja", *common], binary=a.llama_server)
    env = sp.source_env(src)
    print(f"[{name}] {shlex.join(cmd)}", flush=True)
    convs = [[{"role": "user", "content": f"Conversation {c}. Here is a file:\n```python\n{source_file(a.functions)}```\n"
                                          "Read it; questions follow."}] for c in range(a.conversations)]
    turns = []
    with sp.ServerProcess(name, cmd, env=env, log_path=Path(a.log_dir) / f"{name}.log") as srv, httpx.Client(timeout=900) as client:
        turn(client, srv.url, [{"role": "user", "content": "Say hi."}], 4)  # warm-up
        for t in range(a.turns):
            for c, messages in enumerate(convs):
                before = drafter_tokens(srv.url) if server == "warmslot" else {}
                r = turn(client, srv.url, messages, a.n_predict)
                after = drafter_tokens(srv.url) if server == "warmslot" else {}
                r["drafter"] = {k: after[k] - before.get(k, 0.0) for k in after}
                r["turn"], r["conversation"] = t, c
                messages += [{"role": "assistant", "content": r.pop("text")},
                             {"role": "user", "content": FOLLOW_UPS[(t + c) % len(FOLLOW_UPS)]}]
                turns.append(r)
                print(f"  {name} turn {t} conv {c}: prompt {r['prompt_tokens']} cached {r['cached_tokens']} "
                      f"wall {r['wall_s']:.3f}s ttft {r['ttft_s']:.3f}s 2nd {r['second_token_s']:.3f}s drafted {r['drafted']} "
                      f"accepted {r['accepted']} drafter {r['drafter']}", flush=True)
    back = [r for r in turns if r["turn"] > 0]  # each of these returned from the cache
    return {"server": server, "flags": flags, "src": src, "command": cmd, "turns": turns, "returning": {
        "median_wall_s": statistics.median(r["wall_s"] for r in back),
        "median_second_token_s": statistics.median(r["second_token_s"] for r in back),
        "median_ttft_s": statistics.median(r["ttft_s"] for r in back),
        "drafter_evaluated": sum(r["drafter"].get("evaluated", 0) for r in back) if server == "warmslot" else None,
        "drafter_restored": sum(r["drafter"].get("restored", 0) for r in back) if server == "warmslot" else None,
    }}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", "-m", required=True)
    p.add_argument("--draft", "-md", required=True)
    p.add_argument("--config", action="append", required=True, help="NAME=SERVER[:FLAGS], repeated")
    p.add_argument("--src", action="append", default=[], help="NAME=DIR: run that warmslot configuration from DIR")
    p.add_argument("--llama-server", default=str(sp.DEFAULT_LLAMA_SERVER))
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--conversations", type=int, default=2)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--functions", type=int, default=60, help="functions in each conversation's file (about 37 tokens each)")
    p.add_argument("--n-predict", type=int, default=32)
    p.add_argument("--threads", "-t", type=int, default=2)
    p.add_argument("--ctx-size", "-c", type=int, default=16384)
    p.add_argument("--ngl", type=int, default=0)
    p.add_argument("--chat-template-file", default=None)
    p.add_argument("--out", required=True)
    p.add_argument("--log-dir", default=str(bc.REPO_ROOT / "bench-out" / "draft-return"))
    a = p.parse_args(argv)
    sp.install_signal_handlers()
    sources = dict(s.split("=", 1) for s in a.src)
    started = bc.now_iso()
    results = {}
    for text in a.config:
        name, server, flags = parse_config(text)
        results[name] = run_config(name, server, flags, a, sources.get(name))
    doc = {"benchmark": "returning conversations with a draft model", "started": started,
           "finished": bc.now_iso(), "machine": bc.machine_info(), "warmslot_git": bc.git_commit(), "settings": vars(a),
           "summary": {k: v["returning"] for k, v in results.items()}, "results": results}
    bc.write_json(a.out, doc)
    print(json.dumps(doc["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
