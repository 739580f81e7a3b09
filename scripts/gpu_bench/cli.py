"""Side-by-side benchmark of warmslot and llama-server on one model: agent workloads, decode.

Both servers run the same model with the same context size, slots (-np), KV cache types,
batch sizes, flash attention and GPU layers; they are started one at a time, on a free
loopback port, and always stopped. Each keeps its own defaults otherwise: llama-server its
prompt caching (`--cache-ram`, `--ctx-checkpoints`) and, with -np > 1, a KV cache split
evenly between the slots (`--llama-server-kvu` passes -kvu for one shared pool, as warmslot
has); warmslot its own. Every request is a streamed OpenAI request with a timeout; a server
that fails to start or a request that fails is recorded as an error and the run moves on.
The result is ONE JSON file (`--out`), rewritten after every server run, so a run cut short
still leaves what it measured.

Workloads (`--workloads`, comma-separated):

  agent        An agent session replayed through /v1/chat/completions: a system prompt of about
               --system-tokens (instructions; the tool schemas go in `tools`, or into the text
               with --tools-in text), a user task, then --turns requests; after each, the
               assistant turn and a tool result of 0.5K-4K tokens are appended. Modes:
               echo (append the text the server generated), rerender (append a recorded tool
               call, as agents that rebuild their history do), nocache (the rerender history
               with `cache_prompt: false`, the first --nocache-turns requests).
  alternating  Three conversations sharing a --alt-shared-tokens prefix, each with
               --alt-own-tokens of its own, sent A,B,C,A,B,C,... for --alt-rounds rounds
               (a round is one request of each) on one slot; a return appends the previous
               answer and a short user message.
  concurrent   -np 4: four clients, each an agent replay (rerender) of --conc-turns requests
               on a shared --conc-system-tokens system prompt, all at once.
  decode       -np 4: --decode-tokens generated tokens (ignore_eos) by 1 stream and by 4
               concurrent streams, after prompts of each --decode-contexts length.
  restore      From the alternating run's /metrics and /slots (run it if not selected):
               prompt-cache bytes loaded and load time (GB/s), saves, checkpoint restores.
  throughput   Distinct requests: --tp-clients clients drain a queue of --tp-requests
               /v1/completions requests, each a different prompt of --tp-prompt-tokens
               and --tp-gen-tokens generated tokens (ignore_eos, default sampling), for each
               -np of --tp-np, with -c --tp-ctx-size; the servers restart per -np, and every
               --tp-variants entry (server + extra flags) runs too. Aggregate generated
               tokens/s, TTFT percentiles, warmslot's state counters. --profile-warmslot S
               samples warmslot with py-spy for S seconds at the largest -np.
  multiagent   --ma-agents agents run their loops at once on -np --ma-np: a shared system
               prompt and --ma-tools tools (about --ma-system-tokens in all), --ma-turns
               turns each; every reply (--ma-gen-tokens) is echoed back and a tool result of
               --ma-tool-tokens appended. Computed prompt tokens, wall time, latencies,
               warmslot's state counters.
  disk         warmslot's disk tier (warmslot only): a --disk-tokens agent conversation,
               SIGTERM, the files dropped from the page cache, a restart, the next turn's
               TTFT against a cold prefill and the read bandwidth; then a stream's decode
               speed while --spill-requests conversations spill to disk, against the same
               run without the tier, and the write bandwidth (--disk-*, --spill-* flags).
  messages     A Claude-Code-shaped session through /v1/messages (streamed): a main agent (a
               ~20K-token system prompt after a billing header that changes on every request,
               12 tools, --msg-main-turns tool_use -> tool_result turns), two sub-agents (~6K
               system prompts, --msg-sub-turns requests each) in between, then a compaction
               that rewrites the first tool result; once per -np of --msg-np. Per request: the
               agent, prompt, cached and computed tokens, TTFT (first content_block_delta);
               the main agent's TTFT p50 per server and warmslot's computed tokens against
               the ideal. --msg-shapes current (default) sends today's Claude Code shapes: a
               system message after the first user message, adaptive thinking, effort, context
               management, beta headers and a session-title request with a JSON-schema format
               (whether its reply matches is recorded); refused requests are recorded with
               their status and error and the session goes on (errors per agent in the
               summary). --msg-scale 0.1 for a CPU run.
  codex        A Codex-shaped session through /v1/responses (streamed, store: false): two
               developer messages (~10K tokens at --codex-scale 1), the CLI's tools (functions,
               the multi_agent_v1 namespace, hosted web_search), --codex-turns requests that
               each resend the whole history: the output items returned (reasoning with its
               encrypted_content, calls) and a 1K-4K function_call_output. Per request:
               status, error, TTFT, input and cached tokens; TTFT p50 per server and the
               ratio, computed tokens against the ideal, errors (--codex-* flags;
               --codex-scale 0.05 for a CPU run).
  sessions     More Claude-Code-shaped sessions than slots, all at once through /v1/messages
               (streamed): each S:P of --sess-runs is a server run with S sessions on -np P,
               each a main agent (its ~20K-token system prompt and tools the same bytes in
               every session), a background sub-agent (~6K) and a session-title request,
               tool results of 2K-9K or 60-400 tokens, --sess-requests requests in turn. Wall
               time, computed tokens against the ideal (the shared prefix once per run), the
               main agent's TTFT p50 over requests adding < 500 tokens, warmslot's state
               copies over the KV bytes of what it computed (--sess-* flags; --sess-scale 0.03
               for a CPU run).
  models       One server, two models by name (--models-dir, llama-server in router mode):
               Claude Code sessions on the big model (-m) whose session title and a command
               check with every main request go to the small one (--mod-small), at the same
               moment as the main request. Load on demand times, the main agent's TTFT p50,
               the side requests' TTFT during the sessions against alone, device and resident
               memory (--mod-* flags; --mod-scale 0.03 for a CPU run).

Typical use (GPU machine, binaries on PATH):

    python scripts/bench_gpu.py -m /tmp/models/qwen3-8b.gguf --shape qwen3-8b \\
        --workloads agent,alternating,restore --out $OUT/qwen3-8b.json

A CPU dry run on a tiny model:

    python scripts/bench_gpu.py -m tiny.gguf -ngl 0 -t 2 -c 4096 --system-tokens 600 --turns 4 \\
        --gen-tokens 8 --tool-tokens 60,200 --n-tools 4 --alt-shared-tokens 300 \\
        --alt-own-tokens 100 --alt-rounds 2 --decode-tokens 32 --decode-contexts 200 \\
        --conc-system-tokens 300 --conc-turns 3 --out /tmp/bench.json

The agents' sessions on CPU (warmslot alone; a tiny qwen35 from bench_models.py --scale tiny):

    python scripts/bench_gpu.py -m tiny.gguf -ngl 0 -t 2 --servers warmslot --workloads messages,codex \\
        --msg-scale 0.05 --msg-np 1 --msg-main-turns 3 --msg-sub-turns 1 --msg-gen-tokens 8 \\
        --codex-scale 0.05 --codex-turns 4 --codex-gen-tokens 8 --out /tmp/agents.json

Sessions sharing slots on CPU (a micro qwen3-8b from bench_models.py --scale micro):

    python scripts/bench_gpu.py -m micro.gguf -ngl 0 -t 2 --workloads sessions --sess-runs 3:2 \\
        --sess-scale 0.03 --sess-requests 4 --sess-gen-tokens 4 --out /tmp/sessions.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

from scripts import bench_common as bc
from scripts import server_process as sp

from . import LLAMA_SERVER, SERVERS
from .agent import TOOLS
from .servers import Run
from .summary import print_summary
from .workload_agent import AGENT_MODES, workload_agent
from .workload_alternating import workload_alternating, workload_restore
from .workload_codex import add_codex_arguments, workload_codex
from .workload_concurrent import workload_concurrent
from .workload_decode import workload_decode
from .workload_disk import add_disk_arguments, workload_disk
from .workload_messages import add_messages_arguments, parse_messages_np, workload_messages
from .workload_models import add_models_arguments, workload_models
from .workload_multiagent import workload_multiagent
from .workload_sessions import add_sessions_arguments, parse_sessions_runs, workload_sessions
from .workload_throughput import VariantError, parse_variants, workload_throughput

WORKLOADS = ("agent", "alternating", "concurrent", "decode", "restore", "throughput", "multiagent", "disk",
             "messages", "codex", "sessions", "models")
DEFAULT_WORKLOADS = "agent,alternating,concurrent,decode,restore"
RUNNERS = {"agent": workload_agent, "alternating": workload_alternating, "concurrent": workload_concurrent,
           "decode": workload_decode, "throughput": workload_throughput, "multiagent": workload_multiagent,
           "disk": workload_disk, "messages": workload_messages, "codex": workload_codex,
           "sessions": workload_sessions, "models": workload_models}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("-m", "--model", required=True, help="GGUF model")
    p.add_argument("--shape", default=None, help="name of the model's shape (e.g. qwen3-8b), recorded in the JSON")
    p.add_argument("--out", required=True, help="result JSON")
    p.add_argument("--workloads", default=DEFAULT_WORKLOADS,
                   help=f"comma-separated: {','.join(WORKLOADS)}")
    p.add_argument("--servers", default=",".join(SERVERS), help="comma-separated, run in this order")
    p.add_argument("--llama-server", default=None, help="llama-server binary (default: PATH, then build/llama.cpp/bin)")
    p.add_argument("--python", default=sys.executable, help="interpreter that runs warmslot")
    p.add_argument("--warmslot-src", default=None,
                   help="run warmslot from this folder holding a `warmslot` package, ahead of the installed one")
    # server flags, the same for both
    p.add_argument("-c", "--ctx-size", type=int, default=65536, help="context for agent and alternating")
    p.add_argument("-fa", "--flash-attn", default="on", choices=("on", "off", "auto"))
    p.add_argument("-ctk", "--cache-type-k", default="f16")
    p.add_argument("-ctv", "--cache-type-v", default="f16")
    p.add_argument("-b", "--batch-size", type=int, default=2048)
    p.add_argument("-ub", "--ubatch-size", type=int, default=512)
    p.add_argument("-ngl", "--n-gpu-layers", type=int, default=99)
    p.add_argument("-t", "--threads", type=int, default=0, help="-t and -tb for both (0: each server's default)")
    p.add_argument("--chat-template-file", default=None,
                   help="Jinja chat template for both servers (default: the GGUF's)")
    p.add_argument("--template-kwargs", default=None, type=json.loads,
                   help='chat_template_kwargs sent with every chat request, e.g. \'{"enable_thinking": false}\'')
    p.add_argument("--llama-server-kvu", action="store_true",
                   help="pass -kvu to llama-server when -np > 1: one KV pool shared by the slots, as warmslot "
                        "has (default: llama-server's own, each slot gets ctx/np)")
    add_placement_arguments(p)
    p.add_argument("--warmslot-args", default="", help="extra warmslot flags (one string)")
    p.add_argument("--llama-server-args", default="", help="extra llama-server flags (one string)")
    p.add_argument("--card-gib", type=float, default=None,
                   help="a ballast process (PyTorch, as in bench_moe_gpu.py) holds all but this many GiB of the "
                        "GPU for the whole run, so both servers face a card of that size (default: none)")
    # agent
    p.add_argument("--system-tokens", type=int, default=8000)
    p.add_argument("--turns", type=int, default=20, help="requests per replay")
    p.add_argument("--gen-tokens", type=int, default=32, help="max_tokens of agent/alternating/concurrent requests")
    p.add_argument("--tool-tokens", default="500,4000", help="MIN,MAX tokens of a tool result")
    p.add_argument("--n-tools", type=int, default=20, help="tool schemas (at most 20)")
    p.add_argument("--tools-in", default="api", choices=("api", "text"),
                   help="api: send the schemas as `tools`; text: write them into the system prompt")
    p.add_argument("--agent-modes", default="echo,rerender,nocache")
    p.add_argument("--nocache-turns", type=int, default=None, help="requests of the no-cache baseline (default: --turns)")
    p.add_argument("--no-ideal", dest="ideal", action="store_false",
                   help="skip rendering each prompt to tokens for the ideal computed-token count")
    # alternating
    p.add_argument("--alt-shared-tokens", type=int, default=8000)
    p.add_argument("--alt-own-tokens", type=int, default=4000)
    p.add_argument("--alt-rounds", type=int, default=9, help="rounds of A,B,C")
    # concurrent
    p.add_argument("--conc-clients", type=int, default=4)
    p.add_argument("--conc-system-tokens", type=int, default=4000)
    p.add_argument("--conc-turns", type=int, default=8)
    p.add_argument("--conc-ctx-size", type=int, default=0, help="0: enough for every client's whole replay")
    p.add_argument("--conc-distinct-system", action="store_true", help="a different system prompt per client")
    # decode
    p.add_argument("--decode-tokens", type=int, default=512)
    p.add_argument("--decode-contexts", default="1000,16000", help="prompt lengths in tokens")
    p.add_argument("--decode-streams", type=int, default=4)
    p.add_argument("--decode-ctx-size", type=int, default=0, help="0: streams x (longest prompt + decode + 256)")
    add_throughput_arguments(p)
    add_multiagent_arguments(p)
    add_disk_arguments(p)
    add_messages_arguments(p)
    add_codex_arguments(p)
    add_sessions_arguments(p)
    add_models_arguments(p)
    # robustness
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request")
    p.add_argument("--ready-timeout", type=float, default=300.0, help="seconds for a server to load")
    p.add_argument("--time-budget", type=float, default=0.0,
                   help="seconds for the whole run; workloads stop early when it is spent (0: none)")
    p.add_argument("--log-dir", default=None, help="keep server logs here (default: temporary, tail in the JSON)")
    a = p.parse_args(argv)
    a.workloads = [w.strip() for w in a.workloads.split(",") if w.strip()]
    bad = [w for w in a.workloads if w not in WORKLOADS]
    if bad:
        p.error(f"unknown workloads {bad}; choose from {WORKLOADS}")
    a.servers = [s.strip() for s in a.servers.split(",") if s.strip()]
    if any(s not in SERVERS for s in a.servers):
        p.error(f"--servers takes {SERVERS}")
    a.agent_modes = [m.strip() for m in a.agent_modes.split(",") if m.strip()]
    if any(m not in AGENT_MODES for m in a.agent_modes):
        p.error(f"--agent-modes takes {AGENT_MODES}")
    lo, hi = (int(x) for x in a.tool_tokens.split(","))
    a.tool_tokens = (lo, hi)
    a.decode_contexts = [int(x) for x in a.decode_contexts.split(",") if x.strip()]
    a.nocache_turns = min(a.nocache_turns or a.turns, a.turns)
    a.n_tools = max(0, min(a.n_tools, len(TOOLS)))
    a.tp_np = [int(x) for x in a.tp_np.split(",") if x.strip()]
    try:
        a.tp_variants = parse_variants(a.tp_variants)
    except VariantError as exc:
        p.error(str(exc))
    a.ma_tools = max(0, min(a.ma_tools, len(TOOLS)))
    parse_messages_np(a)
    try:
        parse_sessions_runs(a)
    except ValueError as exc:
        p.error(str(exc))
    return a


def add_placement_arguments(p: argparse.ArgumentParser) -> None:
    """Several GPUs or RPC servers: llama-server's flags, which warmslot shares, for both."""
    p.add_argument("-sm", "--split-mode", default=None, choices=("none", "layer", "row", "tensor"),
                   help="how both servers spread the model over the GPUs (default: each server's, layer)")
    p.add_argument("-ts", "--tensor-split", default=None, help="proportions per GPU for both, e.g. 1,1")
    p.add_argument("-mg", "--main-gpu", type=int, default=None, help="--main-gpu for both")
    p.add_argument("-dev", "--device", default=None, help="devices for both, e.g. CUDA0,CUDA1 or RPC0")
    p.add_argument("--rpc", default=None, help="RPC servers (host:port,...) for both")


def add_throughput_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tp-clients", type=int, default=32, help="concurrent clients (requests in flight)")
    p.add_argument("--tp-requests", type=int, default=96, help="requests per run, each with its own prompt")
    p.add_argument("--tp-prompt-tokens", type=int, default=530)
    p.add_argument("--tp-gen-tokens", type=int, default=128, help="generated tokens per request (ignore_eos)")
    p.add_argument("--tp-np", default="1,4,8,16", help="-np values, one server run each")
    p.add_argument("--tp-ctx-size", type=int, default=65536, help="-c of every throughput run")
    p.add_argument("--tp-variants", default="",
                   help="extra runs per -np, ';'-separated SERVER:FLAGS, e.g. "
                        "'warmslot:--cache-ram 0;llama-server:-kvu;llama-server:--cache-ram 0'")
    p.add_argument("--profile-warmslot", type=float, default=0.0, metavar="SECONDS",
                   help="sample warmslot with py-spy for SECONDS during its throughput run at the largest -np, "
                        "and during each of its sessions runs")
    p.add_argument("--profile-rate", type=int, default=100, help="py-spy samples per second")


def add_multiagent_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ma-agents", type=int, default=8, help="agents running at once")
    p.add_argument("--ma-np", type=int, default=4, help="-np of the multiagent run")
    p.add_argument("--ma-turns", type=int, default=6, help="requests per agent")
    p.add_argument("--ma-system-tokens", type=int, default=2800, help="shared system prompt and tools, in all")
    p.add_argument("--ma-tools", type=int, default=8, help="tool schemas")
    p.add_argument("--ma-tool-tokens", type=int, default=530, help="tokens of each tool result (about 400 words)")
    p.add_argument("--ma-gen-tokens", type=int, default=32, help="max_tokens of each request")
    p.add_argument("--ma-ctx-size", type=int, default=0, help="0: -np x one agent's whole conversation, +20%%")


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    sp.install_signal_handlers()
    run = Run(a)
    model = Path(a.model)
    if not model.is_file():
        print(f"model not found: {model}", file=sys.stderr)
        return 2
    if LLAMA_SERVER in a.servers and run.llama_server is None:
        print("llama-server not found; pass --llama-server (its failure is recorded, warmslot still runs)",
              file=sys.stderr)
    run.result = {
        "benchmark": "gpu-side-by-side",
        "started": bc.now_iso(),
        "finished": None,
        "machine": bc.machine_info(),
        "llama_server": bc.llama_server_build_info(run.llama_server) if run.llama_server else None,
        "llama_cpp_python": bc.llama_cpp_python_info(),
        "model": {**bc.file_info(model), "shape": a.shape},
        "settings": {k: v for k, v in vars(a).items()},
        "workloads": {},
        "errors": [],
    }
    run.save()
    ballast = None
    if a.card_gib:
        from scripts.bench_moe_gpu import Ballast

        ballast = Ballast(a.card_gib)
        run.result["ballast"] = {"card_gib": a.card_gib, "line": ballast.line}
    try:
        run_workloads(run)
    finally:
        if ballast is not None:
            ballast.close()
    run.save()
    print_summary(run.result)
    print(f"\nwrote {a.out}")
    return 0


def run_workloads(run: Run) -> None:
    a = run.a
    order = [w for w in WORKLOADS if w in a.workloads]
    if "restore" in order and "alternating" not in order:
        order.insert(order.index("restore"), "alternating")
    for name in order:
        if run.budget.spent():
            run.result["workloads"][name] = {"skipped": "time budget spent"}
            continue
        run.log(f"=== workload {name}")
        t0 = time.perf_counter()
        try:
            if name == "restore":
                run.result["workloads"][name] = workload_restore(run, run.result["workloads"].get("alternating", {}))
            else:
                run.result["workloads"][name] = {"running": True}
                run.result["workloads"][name] = RUNNERS[name](run)
        except Exception as exc:  # noqa: BLE001 - one workload's failure does not end the run
            run.result["errors"].append({"workload": name, "error": f"{type(exc).__name__}: {exc}",
                                         "traceback": traceback.format_exc()[-4000:]})
            run.log(f"workload {name} failed: {exc}")
        if isinstance(run.result["workloads"].get(name), dict):
            run.result["workloads"][name]["wall_s"] = round(time.perf_counter() - t0, 2)
        run.result["model"]["meta"] = run.model_meta
        run.save()
