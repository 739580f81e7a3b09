#!/usr/bin/env python3
"""Side-by-side benchmark of warmslot and llama-server on one model: agent workloads, decode.

Both servers run the same model with the same context size, slots (-np), KV cache types,
batch sizes, flash attention and GPU layers; they are started one at a time, on a free
loopback port, and always stopped. llama-server keeps its own defaults for prompt caching
(`--cache-ram`, `--ctx-checkpoints`), warmslot its own. Every request is a streamed OpenAI
request with a timeout; a server that fails to start or a request that fails is recorded as
an error and the run moves on. The result is ONE JSON file (`--out`), rewritten after every
server run, so a run cut short still leaves what it measured.

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

Typical use (GPU machine, binaries on PATH):

    python scripts/bench_gpu.py -m /tmp/models/qwen3-8b.gguf --shape qwen3-8b \\
        --workloads agent,alternating,restore --out $OUT/qwen3-8b.json

A CPU dry run on a tiny model:

    python scripts/bench_gpu.py -m tiny.gguf -ngl 0 -t 2 -c 4096 --system-tokens 600 --turns 4 \\
        --gen-tokens 8 --tool-tokens 60,200 --n-tools 4 --alt-shared-tokens 300 \\
        --alt-own-tokens 100 --alt-rounds 2 --decode-tokens 32 --decode-contexts 200 \\
        --conc-system-tokens 300 --conc-turns 3 --out /tmp/bench.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shlex
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common as bc
import server_process as sp

WARMSLOT = "warmslot"
LLAMA_SERVER = "llama-server"
SERVERS = (LLAMA_SERVER, WARMSLOT)
WORKLOADS = ("agent", "alternating", "concurrent", "decode", "restore")
AGENT_MODES = ("echo", "rerender", "nocache")


# ============================================================================================
# deterministic pseudo-realistic text
#
# Text is built from lines of English words, code, logs, JSON and listings drawn from a seeded
# random.Random (string seeds hash with SHA-512, so the text is the same on every machine and
# Python run). It re-tokenizes stably: no random byte soup. Sizes in tokens are reached through
# a chars-per-token ratio measured per kind on the first server's /tokenize.

WORDS = (
    "the request server client cache prompt token model slot context batch memory layer buffer "
    "state value record field index table query result error warning file path directory module "
    "function method class object string number list map key option setting flag config user "
    "agent tool call message history session output input stream event handler worker thread "
    "process queue task job schedule retry timeout limit budget size length offset count total "
    "update create delete read write open close start stop load save restore check verify test "
    "build deploy release version commit branch merge patch change diff review issue report "
    "network socket connection address port host proxy route endpoint service api response "
    "status code header body payload schema type format parse encode decode serialize validate "
    "returns accepts requires contains includes describes explains ensures handles supports "
    "quickly carefully safely always never usually often only also still already first last "
    "new old large small long short fast slow empty full valid invalid missing current previous "
    "next local remote shared private public internal external default custom primary secondary "
    "data source target storage database transaction lock snapshot backup migration replica "
    "metric latency throughput usage cost price order customer account invoice payment product"
).split()
NAMES = ("alpha beta gamma delta orion vega atlas nova helix quartz cobalt amber falcon harbor "
         "summit meadow river canyon ember willow").split()
EXTS = ("py", "ts", "go", "rs", "md", "json", "yaml", "toml", "sql", "sh")
DIRS = ("src", "src/server", "src/cache", "src/engine", "lib", "tests", "docs", "scripts", "config", "tools")
LEVELS = ("INFO", "INFO", "INFO", "DEBUG", "WARNING", "INFO", "ERROR")


def _words(rng: random.Random, lo: int, hi: int) -> list[str]:
    return [rng.choice(WORDS) for _ in range(rng.randint(lo, hi))]


def _sentence(rng: random.Random, lo: int = 7, hi: int = 18) -> str:
    w = _words(rng, lo, hi)
    if len(w) > 6 and rng.random() < 0.3:
        w[len(w) // 2] += ","
    return " ".join(w).capitalize() + rng.choice((".", ".", ".", "!", "?") if rng.random() < 0.1 else ".")


def _ident(rng: random.Random, parts: int | None = None) -> str:
    return "_".join(rng.choice(WORDS) for _ in range(parts or rng.randint(1, 3)))


def _camel(rng: random.Random) -> str:
    return "".join(rng.choice(WORDS).capitalize() for _ in range(rng.randint(1, 3)))


def _path(rng: random.Random) -> str:
    return f"{rng.choice(DIRS)}/{_ident(rng, rng.randint(1, 2))}.{rng.choice(EXTS)}"


def _url(rng: random.Random) -> str:
    host = f"{rng.choice(NAMES)}-{rng.choice(WORDS)}.{rng.choice(('com', 'org', 'dev', 'io', 'net'))}"
    return f"https://{host}/{rng.choice(WORDS)}/{_ident(rng, 2).replace('_', '-')}"


def _piece_prose(rng: random.Random, i: int) -> str:
    if rng.random() < 0.15:
        return f"\n## {' '.join(_words(rng, 2, 5)).title()}\n\n"
    if rng.random() < 0.25:
        return "- " + _sentence(rng, 5, 14) + "\n"
    return " ".join(_sentence(rng) for _ in range(rng.randint(2, 4))) + "\n\n"


def _piece_code(rng: random.Random, i: int) -> str:
    fn, a, b, var, attr = _ident(rng), _ident(rng, 1), _ident(rng, 2), _ident(rng, 1), _ident(rng, 1)
    body = [
        f"def {fn}({a}, {b}=None):",
        f'    """{_sentence(rng, 6, 12)}"""',
        f"    {var} = {_ident(rng)}({a}, {attr}={b})",
        f"    if {var} is None:",
        f'        raise ValueError("{" ".join(_words(rng, 3, 7))}")',
        f"    for item in {var}.{attr}:",
        f"        if item.{_ident(rng, 1)} > {rng.randint(0, 4096)}:",
        f"            {_ident(rng, 1)}.append(item)",
        f"    return {var}",
        "",
    ]
    if rng.random() < 0.3:
        body = [f"class {_camel(rng)}:", f'    """{_sentence(rng, 6, 12)}"""', ""] + body
    return "".join(f"{(i * 11 + k) % 9999 + 1:6d}|{line}\n" for k, line in enumerate(body))


def _piece_log(rng: random.Random, i: int) -> str:
    ts = f"2025-03-{1 + i % 28:02d} {i % 24:02d}:{(i * 7) % 60:02d}:{(i * 13) % 60:02d},{(i * 37) % 1000:03d}"
    kv = " ".join(f"{rng.choice(WORDS)}={rng.randint(0, 99999)}" for _ in range(rng.randint(1, 3)))
    line = f"{ts} {rng.choice(LEVELS):7s} {rng.choice(NAMES)}.{_ident(rng, 1)}: {' '.join(_words(rng, 4, 10))} {kv}\n"
    if rng.random() < 0.08:
        line += (f"Traceback (most recent call last):\n  File \"{_path(rng)}\", line {rng.randint(1, 900)}, in "
                 f"{_ident(rng)}\n    {_ident(rng)}({_ident(rng, 1)})\n{_camel(rng)}Error: {' '.join(_words(rng, 3, 8))}\n")
    return line


def _piece_json(rng: random.Random, i: int) -> str:
    rec = {
        "id": f"{rng.choice(NAMES)}-{i:05d}",
        "name": " ".join(_words(rng, 2, 4)),
        "status": rng.choice(("active", "pending", "failed", "done")),
        "count": rng.randint(0, 5000),
        "score": round(rng.random() * 100, 2),
        "tags": [rng.choice(WORDS) for _ in range(rng.randint(1, 4))],
        "owner": {"user": _ident(rng, 2), "team": rng.choice(NAMES)},
        "description": _sentence(rng, 6, 14),
    }
    return json.dumps(rec, indent=2) + ",\n"


def _piece_search(rng: random.Random, i: int) -> str:
    return (f"{i + 1}. {' '.join(_words(rng, 3, 8)).title()}\n   URL: {_url(rng)}\n"
            f"   {_sentence(rng)} {_sentence(rng)}\n\n")


def _piece_listing(rng: random.Random, i: int) -> str:
    if rng.random() < 0.5:
        return f"{_path(rng)}:{rng.randint(1, 2000)}:    {_ident(rng)} = {_ident(rng)}({_ident(rng, 1)})\n"
    return (f"{'d' if rng.random() < 0.2 else '-'}rw-r--r--  {rng.randint(0, 999999):>8d}  "
            f"2025-0{1 + i % 9}-{1 + i % 28:02d}  {_path(rng)}\n")


PIECES = {
    "prose": _piece_prose,
    "code": _piece_code,
    "log": _piece_log,
    "json": _piece_json,
    "search": _piece_search,
    "listing": _piece_listing,
}
DEFAULT_CHARS_PER_TOKEN = {"prose": 4.5, "code": 3.0, "log": 3.0, "json": 3.0, "search": 4.0, "listing": 3.0}


class TextFactory:
    """Deterministic texts of a given size in tokens, calibrated on a server's tokenizer."""

    def __init__(self) -> None:
        self.chars_per_token: dict[str, float] = dict(DEFAULT_CHARS_PER_TOKEN)
        self.calibrated_on: str | None = None
        self._memo: dict[tuple, str] = {}
        self._frozen = False  # set once a text was handed out: every server must get the same texts

    def calibrate(self, server_name: str, url: str) -> None:
        """Chars per token of each kind, from the server's /tokenize (kept for the whole run)."""
        if self._frozen:
            return
        self._frozen = True
        measured = {}
        for kind in PIECES:
            sample = self.raw(kind, f"calibration-{kind}", 12000)
            tokens = tokenize_text(url, sample)
            if tokens:
                measured[kind] = len(sample) / len(tokens)
        if len(measured) == len(PIECES):
            self.chars_per_token = measured
            self.calibrated_on = server_name
            self._memo.clear()

    @staticmethod
    def raw(kind: str, seed: str, n_chars: int) -> str:
        rng = random.Random(f"{kind}:{seed}")
        out, n, i = [], 0, 0
        piece = PIECES[kind]
        while n < n_chars:
            s = piece(rng, i)
            out.append(s)
            n += len(s)
            i += 1
        return "".join(out)

    def text(self, kind: str, seed: str, n_tokens: int) -> str:
        self._frozen = True
        key = (kind, seed, n_tokens)
        if key not in self._memo:
            n_chars = max(1, int(n_tokens * self.chars_per_token[kind]))
            t = self.raw(kind, seed, n_chars)
            self._memo[key] = t.rstrip(",\n ") + "\n" if kind == "json" else t.rstrip() + "\n"
        return self._memo[key]


# ============================================================================================
# the agent: tools, recorded calls, tool results

def _tool(name: str, description: str, params: dict[str, tuple], required: list[str]) -> dict:
    props = {}
    for pname, spec in params.items():
        ptype, pdesc = spec[0], spec[1]
        prop: dict[str, Any] = {"type": ptype, "description": pdesc}
        if len(spec) > 2:
            prop.update(spec[2])
        props[pname] = prop
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": props, "required": required},
    }}


TOOLS = [
    _tool("read_file", "Read a text file from the workspace and return its lines with line numbers. Use offset and "
          "limit to page through large files instead of reading them whole.",
          {"path": ("string", "Path of the file, relative to the workspace root."),
           "offset": ("integer", "First line to return (1-based).", {"minimum": 1}),
           "limit": ("integer", "Most lines to return.", {"minimum": 1, "maximum": 2000})}, ["path"]),
    _tool("write_file", "Create or overwrite a file with the given content. Parent directories are created.",
          {"path": ("string", "Path of the file to write."), "content": ("string", "The complete new content.")},
          ["path", "content"]),
    _tool("patch_file", "Replace one exact occurrence of old_string with new_string in a file. Fails when old_string "
          "is missing or occurs more than once, unless replace_all is true.",
          {"path": ("string", "File to edit."), "old_string": ("string", "Exact text to replace."),
           "new_string": ("string", "Replacement text."),
           "replace_all": ("boolean", "Replace every occurrence.", {"default": False})},
          ["path", "old_string", "new_string"]),
    _tool("list_directory", "List the entries of a directory with their sizes and modification times.",
          {"path": ("string", "Directory to list."), "recursive": ("boolean", "Descend into subdirectories."),
           "max_entries": ("integer", "Most entries to return.", {"default": 500})}, ["path"]),
    _tool("search_files", "Search file contents with a regular expression, like ripgrep. Returns matching lines "
          "as path:line:text.",
          {"pattern": ("string", "Regular expression to search for."),
           "path": ("string", "Directory or file to search in."),
           "glob": ("string", "Only search files whose name matches this glob, e.g. *.py."),
           "case_sensitive": ("boolean", "Match case exactly.", {"default": True})}, ["pattern"]),
    _tool("run_terminal", "Run a shell command in the workspace and return its combined output and exit code. "
          "Long-running commands should use background=true and process_status.",
          {"command": ("string", "The command line to run with bash."),
           "timeout": ("integer", "Seconds before the command is killed.", {"default": 120}),
           "background": ("boolean", "Start the command and return at once with a process id."),
           "workdir": ("string", "Directory to run in.")}, ["command"]),
    _tool("process_status", "Report the status and new output of a background process started by run_terminal.",
          {"process_id": ("string", "The id run_terminal returned."),
           "kill": ("boolean", "Stop the process.")}, ["process_id"]),
    _tool("web_search", "Search the web and return titles, URLs and snippets of the best results.",
          {"query": ("string", "The search query."),
           "max_results": ("integer", "Most results to return.", {"minimum": 1, "maximum": 20}),
           "recency_days": ("integer", "Only results newer than this many days.")}, ["query"]),
    _tool("web_extract", "Fetch web pages and return their main text as markdown, without navigation and ads.",
          {"urls": ("array", "Pages to fetch.", {"items": {"type": "string"}, "maxItems": 5}),
           "max_chars": ("integer", "Truncate each page to this many characters.")}, ["urls"]),
    _tool("browser_navigate", "Open a URL in the headless browser and return an accessibility snapshot of the page.",
          {"url": ("string", "The address to open."),
           "wait_for": ("string", "CSS selector to wait for before the snapshot.")}, ["url"]),
    _tool("browser_click", "Click an element of the current page, identified by its snapshot reference.",
          {"ref": ("string", "Element reference from the last snapshot, e.g. e42."),
           "double": ("boolean", "Double click.")}, ["ref"]),
    _tool("browser_type", "Type text into an input element of the current page.",
          {"ref": ("string", "Element reference from the last snapshot."), "text": ("string", "Text to type."),
           "submit": ("boolean", "Press Enter afterwards.")}, ["ref", "text"]),
    _tool("http_request", "Send an HTTP request and return the status, headers and body of the response.",
          {"method": ("string", "HTTP method.", {"enum": ["GET", "POST", "PUT", "PATCH", "DELETE"]}),
           "url": ("string", "The URL."), "headers": ("object", "Request headers."),
           "body": ("string", "Request body.")}, ["method", "url"]),
    _tool("python_exec", "Run Python code in a persistent sandboxed interpreter and return stdout, stderr and the "
          "value of the last expression.",
          {"code": ("string", "The code to run."), "timeout": ("integer", "Seconds before it is interrupted.")},
          ["code"]),
    _tool("memory_save", "Save a fact to long-term memory so that later sessions can recall it.",
          {"key": ("string", "Short name of the fact."), "content": ("string", "The fact."),
           "tags": ("array", "Labels for later search.", {"items": {"type": "string"}})}, ["key", "content"]),
    _tool("memory_search", "Search long-term memory for facts saved in earlier sessions.",
          {"query": ("string", "What to look for."), "limit": ("integer", "Most facts to return.")}, ["query"]),
    _tool("todo_write", "Replace the task list that tracks progress on the current request.",
          {"todos": ("array", "The tasks.", {"items": {"type": "object", "properties": {
              "content": {"type": "string"}, "status": {"type": "string",
                                                         "enum": ["pending", "in_progress", "completed"]}}}})},
          ["todos"]),
    _tool("send_message", "Send a message to the user on their messaging platform while the task continues.",
          {"text": ("string", "The message."), "channel": ("string", "Channel or chat id.")}, ["text"]),
    _tool("git", "Run a git subcommand in the workspace repository (status, diff, log, show, add, commit, checkout).",
          {"args": ("array", "Arguments after `git`.", {"items": {"type": "string"}})}, ["args"]),
    _tool("delegate_task", "Start a sub-agent with its own context for a self-contained subtask and return its "
          "final report.",
          {"goal": ("string", "What the sub-agent must achieve."),
           "context": ("string", "Everything it needs to know."),
           "toolsets": ("array", "Tool groups it may use.", {"items": {"type": "string"}})}, ["goal"]),
]

# (tool, kind of its result, arguments builder)
CALL_PLAN = [
    ("search_files", "listing", lambda r: {"pattern": f"def {_ident(r)}", "path": r.choice(DIRS), "glob": "*.py"}),
    ("read_file", "code", lambda r: {"path": _path(r), "offset": 1, "limit": 400}),
    ("run_terminal", "log", lambda r: {"command": f"python -m pytest -x tests/test_{_ident(r, 1)}.py -q",
                                       "timeout": 600}),
    ("web_search", "search", lambda r: {"query": " ".join(_words(r, 3, 6)), "max_results": 8}),
    ("web_extract", "prose", lambda r: {"urls": [_url(r)], "max_chars": 20000}),
    ("list_directory", "listing", lambda r: {"path": r.choice(DIRS), "recursive": True}),
    ("http_request", "json", lambda r: {"method": "GET", "url": _url(r) + "?page=1&per_page=100"}),
    ("read_file", "code", lambda r: {"path": _path(r), "offset": r.randint(100, 900), "limit": 300}),
    ("python_exec", "log", lambda r: {"code": f"import {_ident(r, 1)}\nprint({_ident(r, 1)}.{_ident(r)}())"}),
    ("memory_search", "json", lambda r: {"query": " ".join(_words(r, 2, 4)), "limit": 20}),
]


def tool_sizes(n: int, lo: int, hi: int, offset: int = 0) -> list[int]:
    """Deterministic tool-result sizes spread over [lo, hi] (mean about (lo+hi)/2)."""
    steps = 7
    out = []
    for i in range(n):
        k = ((i + offset) * 5 + 3) % (steps + 1)  # 3,0,5,2,7,4,1,6,...: every step once per 8 turns
        out.append(round(lo + (hi - lo) * k / steps))
    return out


class Agent:
    """One replayed agent session: its system prompt, recorded calls and tool results."""

    def __init__(self, texts: TextFactory, *, session: str, system_tokens: int, n_tools: int, tools_in: str,
                 tool_lo: int, tool_hi: int, turns: int, size_offset: int = 0, task_seed: str | None = None,
                 system_seed: str = "system") -> None:
        self.texts = texts
        self.session = session
        self.tools = TOOLS[:n_tools]
        self.tools_in = tools_in
        self.turns = turns
        self.sizes = tool_sizes(turns, tool_lo, tool_hi, size_offset)
        self.system_tokens = system_tokens
        self.system_seed = system_seed
        self.task_seed = task_seed or session
        self._tools_tokens: int | None = None

    def tools_token_estimate(self) -> int:
        text = "\n".join(json.dumps(t) for t in self.tools)
        return int(len(text) / self.texts.chars_per_token["json"])

    def system_message(self) -> str:
        head = (f"Session {self.session}. You are Hermes, an autonomous agent that works in the user's "
                f"workspace with tools.\n\n")
        tools_text = ""
        if self.tools_in == "text":
            tools_text = ("\n\n# Tools\n\nCall a tool by replying with a <tool_call> block holding a JSON object "
                          "with `name` and `arguments`. Available tools:\n\n"
                          + "\n".join(json.dumps(t["function"], indent=1) for t in self.tools) + "\n")
        budget = self.system_tokens - self.tools_token_estimate() - 40
        body = self.texts.text("prose", self.system_seed, max(budget, 100))
        return head + body + tools_text

    def request_tools(self) -> list[dict] | None:
        """The `tools` of every request; the first description names the session, so that a
        template that renders the tools before the system text (Qwen3.5) still starts each
        session's prompt differently within a few tokens."""
        if self.tools_in != "api" or not self.tools:
            return None
        tools = json.loads(json.dumps(self.tools))
        fn = tools[0]["function"]
        fn["description"] = f"(Session {self.session}.) " + fn["description"]
        return tools

    def user_task(self) -> str:
        rng = random.Random(f"task:{self.task_seed}")
        return ("Please look into the following problem in the repository and fix it, running the tests "
                "before you finish. " + " ".join(_sentence(rng) for _ in range(6)))

    def call(self, turn: int) -> tuple[dict, str]:
        """The recorded assistant tool call of `turn` (0-based) and the kind of its result."""
        names = {t["function"]["name"] for t in self.tools}
        plan = [p for p in CALL_PLAN if p[0] in names] or CALL_PLAN
        name, kind, args = plan[turn % len(plan)]
        rng = random.Random(f"call:{self.session}:{turn}")
        call = {"id": f"call_{self.session}_{turn}", "type": "function",
                "function": {"name": name, "arguments": json.dumps(args(rng))}}
        return call, kind

    def tool_result(self, turn: int) -> tuple[str, int]:
        _, kind = self.call(turn)
        size = self.sizes[turn]
        return self.texts.text(kind, f"result:{self.task_seed}:{turn}", size), size

    def first_messages(self) -> list[dict]:
        return [{"role": "system", "content": self.system_message()}, {"role": "user", "content": self.user_task()}]


# ============================================================================================
# HTTP

def tokenize_text(url: str, text: str, add_special: bool = False, timeout: float = 60.0) -> list[int] | None:
    """Token ids of `text` (both servers serve POST /tokenize {"content"})."""
    try:
        r = httpx.post(url + "/tokenize", json={"content": text, "add_special": add_special, "parse_special": True},
                       timeout=timeout)
        if r.status_code == 200:
            toks = r.json().get("tokens")
            if isinstance(toks, list):
                return [t["id"] if isinstance(t, dict) else t for t in toks]
    except (httpx.HTTPError, ValueError):
        pass
    return None


def render_tokens(server: str, url: str, messages: list[dict], tools: list[dict] | None,
                  template_kwargs: dict | None, timeout: float = 120.0) -> list[int] | None:
    """The token ids the server evaluates for a chat request (for the ideal-reuse count)."""
    try:
        if server == WARMSLOT:
            body: dict[str, Any] = {"messages": messages}
            if tools:
                body["tools"] = tools
            r = httpx.post(url + "/tokenize", json=body, timeout=timeout)
            if r.status_code == 200:
                return r.json().get("tokens")
            return None
        body = {"messages": messages}
        if tools:
            body["tools"] = tools
        if template_kwargs:
            body["chat_template_kwargs"] = template_kwargs
        r = httpx.post(url + "/apply-template", json=body, timeout=timeout)
        if r.status_code != 200:
            return None
        return tokenize_text(url, r.json()["prompt"], add_special=True, timeout=timeout)
    except (httpx.HTTPError, ValueError, KeyError):
        return None


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Budget:
    """The run's wall-clock budget (0: none): workloads stop early once it is spent."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds if seconds > 0 else None

    def left(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - time.monotonic()

    def spent(self) -> bool:
        return self.left() <= 0


def stream(url: str, path: str, body: dict, *, timeout: float, keep_chunk_times: bool = False) -> dict[str, Any]:
    """One streamed request, timed on the client.

    ttft_s: request sent -> first chunk carrying generated text, reasoning or a tool-call delta.
    decode_tps: (completion_tokens - 1) / (last such chunk - first). The whole request is bounded by
    `timeout` seconds (read pings do not extend it).
    """
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    rec: dict[str, Any] = {"ok": False, "status": None, "error": None, "ttft_s": None, "total_s": None,
                           "decode_s": None, "decode_tps": None, "token_chunks": 0, "prompt_tokens": None,
                           "cached_tokens": None, "completion_tokens": None, "finish_reason": None}
    content, reasoning, text = [], [], []
    calls: dict[int, dict] = {}
    usage = timings = None
    chunk_times: list[float] = []
    t_first = t_last = None
    t0 = time.perf_counter()
    rec["t_start"] = t0
    try:
        with httpx.Client(timeout=httpx.Timeout(timeout, connect=10.0)) as client, \
                client.stream("POST", url + path, json=body) as r:
            rec["status"] = r.status_code
            rec["cache_header"] = r.headers.get("x-warmslot-cache")
            if r.status_code != 200:
                r.read()
                rec["error"] = f"HTTP {r.status_code}: {r.text[:1500]}"
                return rec
            for line in r.iter_lines():
                now = time.perf_counter()
                if now - t0 > timeout:
                    rec["error"] = f"timed out after {timeout:.0f}s"
                    return rec
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                try:
                    chunk = json.loads(data)
                except json.JSONDecodeError:
                    continue
                if "error" in chunk and not chunk.get("choices"):
                    rec["error"] = json.dumps(chunk["error"])[:1500]
                    return rec
                got = False
                for choice in chunk.get("choices") or []:
                    if choice.get("text"):
                        text.append(choice["text"])
                        got = True
                    delta = choice.get("delta") or {}
                    if delta.get("content"):
                        content.append(delta["content"])
                        got = True
                    if delta.get("reasoning_content"):
                        reasoning.append(delta["reasoning_content"])
                        got = True
                    for tc in delta.get("tool_calls") or []:
                        slot = calls.setdefault(tc.get("index", 0), {"id": None, "name": "", "arguments": ""})
                        if tc.get("id"):
                            slot["id"] = tc["id"]
                        fn = tc.get("function") or {}
                        if fn.get("name"):
                            slot["name"] += fn["name"]
                            got = True
                        if fn.get("arguments"):
                            slot["arguments"] += fn["arguments"]
                            got = True
                    if choice.get("finish_reason"):
                        rec["finish_reason"] = choice["finish_reason"]
                if got:
                    rec["token_chunks"] += 1
                    if t_first is None:
                        t_first = now
                    t_last = now
                    if keep_chunk_times:
                        chunk_times.append(now - t0)
                if chunk.get("usage"):
                    usage = chunk["usage"]
                if chunk.get("timings"):
                    timings = chunk["timings"]
        t_end = time.perf_counter()
    except httpx.HTTPError as exc:
        rec["error"] = f"{type(exc).__name__}: {exc}"
        return rec
    rec["ok"] = True
    rec["total_s"] = t_end - t0
    if t_first is not None:
        rec["ttft_s"] = t_first - t0
        rec["decode_s"] = t_last - t_first
    rec["content"] = "".join(content) if not text else "".join(text)
    rec["reasoning"] = "".join(reasoning)
    rec["tool_calls"] = [calls[i] for i in sorted(calls)]
    rec["usage"] = usage
    rec["timings"] = timings
    if usage:
        rec["prompt_tokens"] = usage.get("prompt_tokens")
        rec["completion_tokens"] = usage.get("completion_tokens")
        rec["cached_tokens"] = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if rec["completion_tokens"] is None:
        rec["completion_tokens"] = rec["token_chunks"]
    if timings and rec["prompt_tokens"] is None and "prompt_n" in timings:
        rec["prompt_tokens"] = timings["prompt_n"] + timings.get("cache_n", 0)
    if rec["decode_s"] and rec["completion_tokens"] and rec["completion_tokens"] > 1:
        rec["decode_tps"] = (rec["completion_tokens"] - 1) / rec["decode_s"]
    if keep_chunk_times:
        rec["chunk_times"] = chunk_times
    return rec


def request_record(r: dict[str, Any]) -> dict[str, Any]:
    """The figures of one request that go into the JSON (no texts beyond a short head)."""
    t = r.get("timings") or {}
    out = {k: r.get(k) for k in ("ok", "status", "error", "ttft_s", "total_s", "decode_s", "decode_tps",
                                 "prompt_tokens", "cached_tokens", "completion_tokens", "token_chunks",
                                 "finish_reason", "cache_header")}
    out["computed_tokens"] = computed_tokens(r)
    out["server_cache_n"] = t.get("cache_n")
    out["server_prompt_n"] = t.get("prompt_n")
    out["server_prompt_ms"] = t.get("prompt_ms")
    out["server_prompt_per_second"] = t.get("prompt_per_second")
    out["server_predicted_per_second"] = t.get("predicted_per_second")
    gen = (r.get("reasoning") or "") + (r.get("content") or "")
    out["text_sha1"] = hashlib.sha1(gen.encode()).hexdigest()[:12] if r.get("ok") else None
    out["text_head"] = gen[:60] if r.get("ok") else None
    out["tool_calls"] = [c.get("name") for c in r.get("tool_calls") or []] or None
    return out


def computed_tokens(r: dict[str, Any]) -> int | None:
    """Prompt tokens the server evaluated: llama-server's timings.prompt_n, else prompt - cached."""
    t = r.get("timings") or {}
    if t.get("prompt_n") is not None:
        return int(t["prompt_n"])
    if r.get("prompt_tokens") is not None and r.get("cached_tokens") is not None:
        return int(r["prompt_tokens"]) - int(r["cached_tokens"])
    return None


def sampling_body(a: argparse.Namespace, max_tokens: int) -> dict[str, Any]:
    # Greedy on both servers; top_k=1 keeps llama-server's sampler chain from sorting the vocabulary.
    body: dict[str, Any] = {"model": "bench", "max_tokens": max_tokens, "temperature": 0.0, "top_k": 1,
                            "top_p": 1.0, "min_p": 0.0, "seed": 0, "ignore_eos": True}
    if a.template_kwargs:
        body["chat_template_kwargs"] = a.template_kwargs
    return body


# ============================================================================================
# servers

class Run:
    """Shared state of one invocation: settings, texts, the result document, the budget."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.texts = TextFactory()
        self.budget = Budget(a.time_budget)
        self.result: dict[str, Any] = {}
        self.llama_server = bc.find_llama_server(a.llama_server)
        self.model_meta: dict[str, Any] | None = None
        self.log_dir = Path(a.log_dir) if a.log_dir else None

    def save(self) -> None:
        self.result["finished"] = bc.now_iso()
        self.result["calibration"] = {"chars_per_token": self.texts.chars_per_token,
                                      "calibrated_on": self.texts.calibrated_on}
        bc.write_json(self.a.out, self.result)

    def log(self, msg: str) -> None:
        left = self.budget.left()
        tag = f"[{time.strftime('%H:%M:%S')}" + (f" {left:.0f}s left]" if left != float("inf") else "]")
        print(f"{tag} {msg}", flush=True)

    def timeout(self) -> float:
        return max(5.0, min(self.a.request_timeout, self.budget.left() + 30.0))

    def flags(self, server: str, np_: int, ctx: int, extra: list[str] | None = None) -> list[str]:
        a = self.a
        f = ["-c", str(ctx), "-np", str(np_), "-fa", a.flash_attn, "-ctk", a.cache_type_k, "-ctv", a.cache_type_v,
             "-b", str(a.batch_size), "-ub", str(a.ubatch_size), "-ngl", str(a.n_gpu_layers)]
        if a.threads:
            f += ["-t", str(a.threads), "-tb", str(a.threads)]
        if server == LLAMA_SERVER:
            f += ["--jinja", "--metrics", "--slots"]
            if np_ > 1 and a.kv_unified:
                f += ["-kvu"]  # one KV pool shared by the slots, as warmslot has (else each slot gets ctx/np)
            if a.chat_template_file:
                f += ["--chat-template-file", a.chat_template_file]
            f += shlex.split(a.llama_server_args)
        else:
            if a.chat_template_file:
                f += ["--chat-template", a.chat_template_file]
            f += shlex.split(a.warmslot_args)
        return f + list(extra or [])

    def command(self, server: str, np_: int, ctx: int, extra: list[str] | None = None) -> list[str]:
        flags = self.flags(server, np_, ctx, extra)
        if server == WARMSLOT:
            return sp.warmslot_command(self.a.model, flags, python=self.a.python)
        return sp.llama_server_command(self.a.model, flags,
                                       binary=self.llama_server or self.a.llama_server or "llama-server")


class Served:
    """A started server (or the error that kept it from starting), as a context manager."""

    def __init__(self, run: Run, server: str, np_: int, ctx: int, label: str, extra: list[str] | None = None) -> None:
        self.run, self.server, self.label = run, server, label
        self.cmd = run.command(server, np_, ctx, extra)
        self.proc: sp.ServerProcess | None = None
        self.info: dict[str, Any] = {"command": self.cmd, "np": np_, "ctx": ctx}

    def __enter__(self) -> Served:
        run = self.run
        if self.server == LLAMA_SERVER and run.llama_server is None:
            self.info["error"] = "llama-server not found (pass --llama-server)"
            return self
        log_path = run.log_dir / f"{self.label}-{self.server}.log" if run.log_dir else None
        run.log(f"starting {self.server} ({self.label}): {shlex.join(self.cmd)}")
        try:
            self.proc = sp.ServerProcess(self.server, self.cmd, log_path=log_path,
                                         ready_timeout=min(run.a.ready_timeout, max(30.0, run.budget.left())))
            self.info["load_s"] = round(self.proc.load_s or 0, 2)
            run.log(f"{self.server} ready in {self.proc.load_s:.1f}s on {self.proc.url}")
            self._warmup()
            if self.server == LLAMA_SERVER:
                caps = (bc.get_json(self.url, "/props") or {}).get("chat_template_caps")
                self.info["chat_template_caps"] = caps
                if caps and caps.get("supports_tools") is False and run.a.tools_in == "api" and run.a.n_tools:
                    self.info["warning"] = (
                        "the chat template does not support tools: llama-server leaves `tools` out of the prompt "
                        "while warmslot injects them, so the prompts differ; pass --chat-template-file with a "
                        "template that renders tools, or --tools-in text")
                    run.log("WARNING: " + self.info["warning"])
            if run.model_meta is None and self.server == WARMSLOT:
                models = bc.get_json(self.proc.url, "/v1/models") or {}
                data = models.get("data") or [{}]
                run.model_meta = data[0].get("meta")
        except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
            self.info["error"] = f"{type(exc).__name__}: {exc}"[:4000]
            run.log(f"{self.server} failed to start: {str(exc)[:400]}")
            self.proc = None
        return self

    def _warmup(self) -> None:
        assert self.proc is not None
        self.run.texts.calibrate(self.server, self.url)
        body = {**sampling_body(self.run.a, 4), "prompt": "Warm-up request."}
        r = stream(self.url, "/v1/completions", body, timeout=self.run.timeout())
        self.info["warmup"] = request_record(r)

    @property
    def ok(self) -> bool:
        return self.proc is not None

    @property
    def url(self) -> str:
        assert self.proc is not None
        return self.proc.url

    def scrape(self) -> dict[str, Any]:
        """The server's /metrics (parsed, selected) and /slots (summarised)."""
        out: dict[str, Any] = {}
        text = bc.get_text(self.url, "/metrics")
        if text:
            m = bc.parse_prometheus(text)
            out["metrics"] = {k: v for k, v in m.items()
                              if k.startswith(("warmslot_prompt", "warmslot_checkpoint", "warmslot_logits",
                                               "warmslot_full_prefills", "warmslot_kv", "warmslot_prefill",
                                               "warmslot_decode", "warmslot_generated", "warmslot_engine",
                                               "warmslot_time_to_first_token_seconds_sum",
                                               "warmslot_time_to_first_token_seconds_count", "llamacpp:"))}
        slots = bc.get_json(self.url, "/slots")
        if slots is not None:
            out["slots"] = summarise_slots(slots)
        return out

    def counters(self) -> dict[str, float]:
        """Generation counters of /metrics (warmslot's engine decode time, llama-server's predicted time)."""
        text = bc.get_text(self.url, "/metrics") or ""
        m = bc.parse_prometheus(text) if text else {}
        keys = ("warmslot_decode_tokens_total", "warmslot_decode_seconds_total", "warmslot_generated_tokens_total",
                "llamacpp:tokens_predicted_total", "llamacpp:tokens_predicted_seconds_total", "llamacpp:n_decode_total")
        return {k: m[k] for k in keys if k in m}

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.info["log_tail"] = self.proc.output_tail(25)
            rc = self.proc.stop()
            self.info["exit_code"] = rc
            self.run.log(f"stopped {self.server}")
        self.proc = None


def summarise_slots(slots: Any) -> Any:
    """/slots without prompt texts: warmslot's checkpoint view, llama-server's per-slot counters."""
    def trim(v: Any, depth: int = 0) -> Any:
        if isinstance(v, str):
            return v if len(v) <= 200 else v[:200] + f"...({len(v)} chars)"
        if isinstance(v, list):
            if len(v) > 64 and all(isinstance(x, (int, float)) for x in v):
                return f"[{len(v)} numbers]"
            return [trim(x, depth + 1) for x in v[:64]]
        if isinstance(v, dict):
            return {k: trim(x, depth + 1) for k, x in v.items() if k not in ("prompt", "tokens", "generated")}
        return v

    out: dict[str, Any] = {"raw": trim(slots)}
    if isinstance(slots, dict) and "slots" in slots:  # warmslot
        out["checkpoint_bytes"] = sum(s.get("checkpoint_bytes", 0) for s in slots["slots"])
        out["checkpoints"] = sum(len(s.get("checkpoints", [])) for s in slots["slots"])
        cache = slots.get("cache") or {}
        out["prompt_cache_bytes"] = cache.get("bytes")
        out["prompt_cache_entries"] = len(cache.get("entries") or [])
    return out


# ============================================================================================
# workloads

def summarise_turns(turns: list[dict], mode: str, first_k: int | None = None) -> dict[str, Any]:
    ok = [t for t in turns if t.get("ok")]
    later = [t for t in ok if t["turn"] >= 2]

    def total(key: str, rows: list[dict]) -> int | None:
        vals = [t.get(key) for t in rows]
        return None if not rows or any(v is None for v in vals) else int(sum(vals))

    out = {
        "mode": mode,
        "turns": len(turns),
        "turns_ok": len(ok),
        "errors": [t.get("error") for t in turns if not t.get("ok")],
        "prompt_tokens_total": total("prompt_tokens", ok),
        "cached_tokens_total": total("cached_tokens", ok),
        "computed_tokens_total": total("computed_tokens", ok),
        "ideal_computed_total": total("ideal_computed", ok),
        "completion_tokens_total": total("completion_tokens", ok),
        "last_prompt_tokens": ok[-1]["prompt_tokens"] if ok else None,
        "wall_s": sum(t["total_s"] for t in ok) if ok else None,
        "ttft_s_p50_turn2plus": bc.percentile([t["ttft_s"] for t in later], 50),
        "ttft_s_p95_turn2plus": bc.percentile([t["ttft_s"] for t in later], 95),
        "ttft_s_turn1": ok[0]["ttft_s"] if ok and ok[0]["turn"] == 1 else None,
        "decode_tps_p50": bc.percentile([t["decode_tps"] for t in ok], 50),
        "server_prompt_ms_total": sum(t["server_prompt_ms"] for t in ok if t.get("server_prompt_ms") is not None)
        if any(t.get("server_prompt_ms") is not None for t in ok) else None,
    }
    if out["computed_tokens_total"] and out["ideal_computed_total"]:
        out["computed_over_ideal"] = out["computed_tokens_total"] / out["ideal_computed_total"]
    if first_k:
        head = [t for t in ok if t["turn"] <= first_k]
        out["first_k"] = first_k
        out["wall_s_first_k"] = sum(t["total_s"] for t in head) if head else None
        out["computed_tokens_first_k"] = total("computed_tokens", head)
    return out


def run_agent_mode(run: Run, srv: Served, mode: str, session: str, turns: int) -> dict[str, Any]:
    """One replay; returns {"turns": [...], "summary": {...}} (errors recorded per turn)."""
    a = run.a
    lo, hi = a.tool_tokens
    agent = Agent(run.texts, session=session, system_tokens=a.system_tokens, n_tools=a.n_tools,
                  tools_in=a.tools_in, tool_lo=lo, tool_hi=hi, turns=a.turns, task_seed="agent")
    tools = agent.request_tools()
    messages = agent.first_messages()
    rows: list[dict] = []
    prev_tokens: list[int] | None = None
    prev_gen: list[int] = []
    prev_prompt = prev_completion = None
    t_mode = time.perf_counter()
    stop_reason = None
    for turn in range(1, turns + 1):
        if run.budget.spent():
            stop_reason = "time budget spent"
            break
        body = {**sampling_body(a, a.gen_tokens), "messages": messages}
        if tools:
            body["tools"] = tools
        if mode == "nocache":
            body["cache_prompt"] = False
        r = stream(srv.url, "/v1/chat/completions", body, timeout=run.timeout())
        row = {"turn": turn, "messages": len(messages), **request_record(r)}
        # ideal: the tokens that are really new this turn (see the report for the definition)
        if a.ideal and mode != "nocache" and r.get("ok"):
            toks = render_tokens(srv.server, srv.url, messages, tools, a.template_kwargs)
            if toks is not None:
                row["rendered_tokens"] = len(toks)
                if prev_tokens is None:
                    reuse = 0
                else:
                    reuse = common_prefix(toks, prev_tokens + prev_gen)
                row["ideal_reusable"] = reuse
                row["ideal_computed"] = len(toks) - reuse
                prev_tokens = toks
                gen_text = (r.get("reasoning") or "") + (r.get("content") or "")
                prev_gen = (tokenize_text(srv.url, gen_text) or []) if mode == "echo" and gen_text else []
        if row.get("ideal_computed") is None and r.get("ok") and r.get("prompt_tokens") is not None:
            # arithmetic fallback: everything past the previous prompt (+ its completion when echoed)
            p = r["prompt_tokens"]
            if prev_prompt is None:
                row["ideal_computed_approx"] = p
            else:
                seen = prev_prompt + ((prev_completion or 0) if mode == "echo" else 0)
                row["ideal_computed_approx"] = max(0, p - min(seen, p))
        rows.append(row)
        c = row.get("computed_tokens")
        run.log(f"  {srv.server:12s} {mode:8s} turn {turn:2d}: prompt {row['prompt_tokens']} cached "
                f"{row['cached_tokens']} computed {c} ideal {row.get('ideal_computed')} TTFT "
                f"{(row['ttft_s'] or 0) * 1000:.0f} ms decode {row['decode_tps'] or 0:.1f} tok/s"
                + (f" ERROR {row['error'][:200]}" if row.get("error") else ""))
        if not r.get("ok"):
            stop_reason = "request failed"
            break
        prev_prompt, prev_completion = r.get("prompt_tokens"), r.get("completion_tokens")
        if turn == turns:
            break
        # the assistant turn, then the tool result
        call, _ = agent.call(turn - 1)
        if mode == "echo":
            msg: dict[str, Any] = {"role": "assistant", "content": r.get("content") or ""}
            if r.get("reasoning"):
                msg["reasoning_content"] = r["reasoning"]
            got_calls = [c for c in r.get("tool_calls") or [] if c.get("name")]
            if got_calls:
                msg["tool_calls"] = [{"id": c.get("id") or f"call_echo_{turn}_{i}", "type": "function",
                                      "function": {"name": c["name"], "arguments": c.get("arguments") or "{}"}}
                                     for i, c in enumerate(got_calls)]
                call_id = msg["tool_calls"][0]["id"]
            else:
                call_id = call["id"]
        else:
            msg = {"role": "assistant", "content": "", "tool_calls": [call]}
            call_id = call["id"]
        result, _size = agent.tool_result(turn - 1)
        messages = messages + [msg, {"role": "tool", "tool_call_id": call_id, "content": result}]
        if prev_prompt is not None and prev_prompt + _size + 2 * a.gen_tokens + 256 > srv.info["ctx"]:
            stop_reason = "the next prompt would not fit the context"
            break
    summary = summarise_turns(rows, mode, first_k=a.nocache_turns if mode != "nocache" else None)
    summary["measured_wall_s"] = time.perf_counter() - t_mode
    summary["stopped"] = stop_reason
    return {"turns": rows, "summary": summary}


def probe_cache_prompt(run: Run, srv: Served) -> dict[str, Any]:
    """Does the server honour `cache_prompt: false`? Sends the same short prompt twice."""
    prompt = run.texts.text("prose", "cache-prompt-probe", 200)
    body = {**sampling_body(run.a, 1), "prompt": prompt}
    first = stream(srv.url, "/v1/completions", body, timeout=run.timeout())
    second = stream(srv.url, "/v1/completions", {**body, "cache_prompt": False}, timeout=run.timeout())
    cached = second.get("cached_tokens")
    t = second.get("timings") or {}
    if t.get("cache_n") is not None:
        cached = t["cache_n"]
    honoured = bool(first.get("ok") and second.get("ok") and cached == 0)
    return {"honoured": honoured, "cached_tokens_with_cache_prompt_false": cached,
            "first": request_record(first), "second": request_record(second)}


def workload_agent(run: Run) -> dict[str, Any]:
    a = run.a
    out: dict[str, Any] = {"settings": {
        "system_tokens": a.system_tokens, "turns": a.turns, "gen_tokens": a.gen_tokens, "tool_tokens": a.tool_tokens,
        "n_tools": a.n_tools, "tools_in": a.tools_in, "modes": a.agent_modes, "nocache_turns": a.nocache_turns,
        "ctx": a.ctx_size, "np": 1,
        "tool_result_sizes": tool_sizes(a.turns, *a.tool_tokens)}, "servers": {}}
    for server in a.servers:
        res: dict[str, Any] = {"modes": {}}
        out["servers"][server] = res
        with Served(run, server, 1, a.ctx_size, "agent") as srv:
            res["server"] = srv.info
            if not srv.ok:
                continue
            nocache_mode = "nocache" in a.agent_modes
            for mode in a.agent_modes:
                if mode == "nocache":
                    continue
                run.log(f"agent replay, {mode}, on {server}")
                res["modes"][mode] = run_agent_mode(run, srv, mode, mode, a.turns)
                run.save()
            if nocache_mode:
                probe = probe_cache_prompt(run, srv)
                res["cache_prompt_probe"] = probe
                if server == LLAMA_SERVER or probe["honoured"]:
                    if server == WARMSLOT:
                        res["nocache_note"] = "run on a separate warmslot server with --cache-ram 0"
                    else:
                        run.log(f"agent replay, nocache ({a.nocache_turns} turns), on {server}")
                        res["modes"]["nocache"] = run_agent_mode(run, srv, "nocache", "nocache", a.nocache_turns)
                else:
                    res["nocache_note"] = ("warmslot ignores cache_prompt=false (a repeated prompt still came from "
                                           "the cache): its no-cache baseline is not run; compare with "
                                           "llama-server's")
                    run.log(res["nocache_note"])
        if server == WARMSLOT and "nocache" in a.agent_modes and res.get("cache_prompt_probe", {}).get("honoured"):
            with Served(run, server, 1, a.ctx_size, "agent-nocache", ["--cache-ram", "0"]) as srv:
                res["server_nocache"] = srv.info
                if srv.ok:
                    res["modes"]["nocache"] = run_agent_mode(run, srv, "nocache", "nocache", a.nocache_turns)
        run.save()
    return out


def alternating_conversations(run: Run) -> tuple[Agent, list[list[dict]]]:
    a = run.a
    shared = Agent(run.texts, session="alternating", system_tokens=a.alt_shared_tokens, n_tools=a.n_tools,
                   tools_in=a.tools_in, tool_lo=1, tool_hi=1, turns=1, system_seed="alt-system")
    system = {"role": "system", "content": shared.system_message()}
    convs = []
    for name, kind in zip("ABC", ("code", "prose", "log")):
        doc = run.texts.text(kind, f"alt-own-{name}", a.alt_own_tokens)
        user = {"role": "user", "content": f"Conversation {name}. Here is the material to work on:\n\n{doc}\n"
                                           f"Summarise what matters in it."}
        convs.append([system, user])
    return shared, convs


def workload_alternating(run: Run) -> dict[str, Any]:
    a = run.a
    out: dict[str, Any] = {"settings": {"shared_tokens": a.alt_shared_tokens, "own_tokens": a.alt_own_tokens,
                                        "rounds": a.alt_rounds, "gen_tokens": a.gen_tokens, "np": 1,
                                        "ctx": a.ctx_size}, "servers": {}}
    for server in a.servers:
        res: dict[str, Any] = {"requests": []}
        out["servers"][server] = res
        with Served(run, server, 1, a.ctx_size, "alternating") as srv:
            res["server"] = srv.info
            if not srv.ok:
                continue
            shared, convs = alternating_conversations(run)
            tools = shared.request_tools()
            t0 = time.perf_counter()
            for rnd in range(a.alt_rounds):
                for ci, name in enumerate("ABC"):
                    if run.budget.spent():
                        res["stopped"] = "time budget spent"
                        break
                    body = {**sampling_body(a, a.gen_tokens), "messages": convs[ci]}
                    if tools:
                        body["tools"] = tools
                    r = stream(srv.url, "/v1/chat/completions", body, timeout=run.timeout())
                    row = {"round": rnd + 1, "conversation": name, "return": rnd > 0, **request_record(r)}
                    res["requests"].append(row)
                    run.log(f"  {server:12s} round {rnd + 1} {name}: prompt {row['prompt_tokens']} cached "
                            f"{row['cached_tokens']} computed {row['computed_tokens']} TTFT "
                            f"{(row['ttft_s'] or 0) * 1000:.0f} ms" + (f" ERROR {row['error'][:200]}"
                                                                       if row.get("error") else ""))
                    if r.get("ok"):
                        rng = random.Random(f"alt-followup:{name}:{rnd}")
                        convs[ci] = convs[ci] + [
                            {"role": "assistant", "content": r.get("content") or "",
                             **({"reasoning_content": r["reasoning"]} if r.get("reasoning") else {})},
                            {"role": "user", "content": " ".join(_sentence(rng) for _ in range(3))},
                        ]
                if res.get("stopped"):
                    break
            res["wall_s"] = time.perf_counter() - t0
            res.update(srv.scrape())
            rows = res["requests"]
            ok = [r for r in rows if r.get("ok")]
            res["summary"] = {
                "requests": len(rows), "ok": len(ok),
                "ttft_s_p50_returns": bc.percentile([r["ttft_s"] for r in ok if r["return"]], 50),
                "ttft_s_p50_first": bc.percentile([r["ttft_s"] for r in ok if not r["return"]], 50),
                "computed_tokens_returns": sum(r["computed_tokens"] or 0 for r in ok if r["return"]),
                "prompt_tokens_returns": sum(r["prompt_tokens"] or 0 for r in ok if r["return"]),
                "cached_tokens_returns": sum(r["cached_tokens"] or 0 for r in ok if r["return"]),
            }
        run.save()
    return out


def workload_restore(run: Run, alternating: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"source": "the alternating workload's /metrics and /slots", "servers": {}}
    for server, res in (alternating.get("servers") or {}).items():
        m = res.get("metrics") or {}
        slots = res.get("slots") or {}
        if server == WARMSLOT:
            loaded = m.get("warmslot_prompt_cache_loaded_bytes_total")
            load_s = m.get("warmslot_prompt_cache_load_seconds_total")
            saved = m.get("warmslot_prompt_cache_saved_bytes_total")
            save_s = m.get("warmslot_prompt_cache_save_seconds_total")
            out["servers"][server] = {
                "prompt_cache_loaded_bytes": loaded, "prompt_cache_load_seconds": load_s,
                "load_gb_per_s": loaded / load_s / 1e9 if loaded and load_s else None,
                "prompt_cache_saved_bytes": saved, "prompt_cache_save_seconds": save_s,
                "save_gb_per_s": saved / save_s / 1e9 if saved and save_s else None,
                "prompt_cache_hits": m.get("warmslot_prompt_cache_hits_total"),
                "prompt_cache_misses": m.get("warmslot_prompt_cache_misses_total"),
                "checkpoints_created": m.get("warmslot_checkpoints_created_total"),
                "checkpoints_restored": m.get("warmslot_checkpoints_restored_total"),
                "logits_reused": m.get("warmslot_logits_reused_total"),
                "checkpoint_bytes_held": slots.get("checkpoint_bytes", m.get("warmslot_checkpoint_bytes")),
                "prompt_cache_bytes_held": slots.get("prompt_cache_bytes", m.get("warmslot_prompt_cache_bytes")),
                "prompt_tokens_by_source": {k.split("source=")[1].rstrip("}"): v for k, v in m.items()
                                            if k.startswith("warmslot_prompt_tokens_total{")},
            }
        else:
            out["servers"][server] = {
                "note": "llama-server reports no prompt-cache load bytes or times; its counters:",
                "metrics": {k: v for k, v in m.items() if k.startswith("llamacpp:")},
                "slots": slots.get("raw"),
            }
    return out


def workload_concurrent(run: Run) -> dict[str, Any]:
    a = run.a
    lo, hi = a.tool_tokens
    n = a.conc_clients
    per_stream = a.conc_system_tokens + 400 + max(sum(tool_sizes(a.conc_turns, lo, hi, 3 * i)) for i in range(n)) \
        + a.conc_turns * (a.gen_tokens + 200)
    ctx = a.conc_ctx_size or _round_up(int(per_stream * 1.1) * n, 1024)
    out: dict[str, Any] = {"settings": {"clients": n, "system_tokens": a.conc_system_tokens, "turns": a.conc_turns,
                                        "gen_tokens": a.gen_tokens, "np": n, "ctx": ctx,
                                        "shared_system_prompt": not a.conc_distinct_system}, "servers": {}}
    for server in a.servers:
        res: dict[str, Any] = {}
        out["servers"][server] = res
        with Served(run, server, n, ctx, "concurrent") as srv:
            res["server"] = srv.info
            if not srv.ok:
                continue
            agents = [Agent(run.texts, session=f"conc-{i}", system_tokens=a.conc_system_tokens, n_tools=a.n_tools,
                            tools_in=a.tools_in, tool_lo=lo, tool_hi=hi, turns=a.conc_turns, size_offset=3 * i,
                            task_seed=f"conc-task-{i}",
                            system_seed="conc-system" + (f"-{i}" if a.conc_distinct_system else ""))
                      for i in range(n)]
            if not a.conc_distinct_system:  # one session line, so the whole system prompt is shared
                for ag in agents:
                    ag.session = "conc"
            streams: list[list[dict]] = [[] for _ in range(n)]
            barrier = threading.Barrier(n)
            t_origin = [0.0]

            def client(i: int, agents=agents, barrier=barrier, streams=streams, t_origin=t_origin) -> None:
                ag = agents[i]
                tools = ag.request_tools()
                messages = ag.first_messages()
                barrier.wait()
                for turn in range(1, a.conc_turns + 1):
                    if run.budget.spent():
                        streams[i].append({"turn": turn, "ok": False, "error": "time budget spent"})
                        return
                    body = {**sampling_body(a, a.gen_tokens), "messages": messages}
                    if tools:
                        body["tools"] = tools
                    r = stream(srv.url, "/v1/chat/completions", body, timeout=run.timeout())
                    row = {"client": i, "turn": turn, "t_offset_s": r["t_start"] - t_origin[0], **request_record(r)}
                    streams[i].append(row)
                    if not r.get("ok"):
                        return
                    call = {"id": f"call_{i}_{turn}", "type": "function",
                            "function": ag.call(turn - 1)[0]["function"]}
                    result, _ = ag.tool_result(turn - 1)
                    messages = messages + [{"role": "assistant", "content": "", "tool_calls": [call]},
                                           {"role": "tool", "tool_call_id": call["id"], "content": result}]

            t_origin[0] = time.perf_counter()
            threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(n)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(max(1.0, run.timeout() * a.conc_turns))
            wall = time.perf_counter() - t_origin[0]
            rows = [r for s in streams for r in s]
            ok = [r for r in rows if r.get("ok")]
            res["requests"] = rows
            res["wall_s"] = wall
            gen = sum(r["completion_tokens"] or 0 for r in ok)
            per_client = []
            for i, s in enumerate(streams):
                sok = [r for r in s if r.get("ok")]
                per_client.append({"client": i, "requests": len(s), "ok": len(sok),
                                   "decode_tps_p50": bc.percentile([r["decode_tps"] for r in sok], 50),
                                   "ttft_s_p50": bc.percentile([r["ttft_s"] for r in sok], 50),
                                   "wall_s": (sok[-1]["t_offset_s"] + sok[-1]["total_s"]) if sok else None})
            res["summary"] = {
                "requests": len(rows), "ok": len(ok),
                "errors": [r.get("error") for r in rows if not r.get("ok")][:10],
                "generated_tokens": gen,
                "generated_tokens_per_wall_s": gen / wall if wall else None,
                "decode_tps_per_request_p50": bc.percentile([r["decode_tps"] for r in ok], 50),
                "decode_tps_sum_of_client_p50": sum(c["decode_tps_p50"] or 0 for c in per_client),
                "ttft_s_p50": bc.percentile([r["ttft_s"] for r in ok], 50),
                "ttft_s_p95": bc.percentile([r["ttft_s"] for r in ok], 95),
                "computed_tokens_total": sum(r["computed_tokens"] or 0 for r in ok),
                "prompt_tokens_total": sum(r["prompt_tokens"] or 0 for r in ok),
                "per_client": per_client,
            }
            res.update(srv.scrape())
            s = res["summary"]
            run.log(f"  {server:12s} concurrent: {len(ok)}/{len(rows)} ok, wall {wall:.1f}s, TTFT p50 "
                    f"{(s['ttft_s_p50'] or 0) * 1000:.0f} ms p95 {(s['ttft_s_p95'] or 0) * 1000:.0f} ms, decode p50 "
                    f"{s['decode_tps_per_request_p50'] or 0:.1f} tok/s per stream")
        run.save()
    return out


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def decode_window(results: list[dict], min_window_s: float = 0.5, min_chunks: int = 8) -> dict[str, Any]:
    """Aggregate decode rate of concurrent streams, from the client's chunk arrival times.

    "window": from the latest first token to the earliest last token, while every stream was
    generating, counting each stream's chunks inside it (scaled to tokens); used when the window
    lasts at least `min_window_s` and holds `min_chunks` chunks per stream. Otherwise "span":
    all tokens after each stream's first, over the earliest first token to the latest last token.
    """
    ok = [r for r in results if r.get("ok") and r.get("chunk_times")]
    if len(ok) != len(results) or not ok:
        return {"method": None, "window_s": None, "aggregate_tps": None}
    start = max(r["chunk_times"][0] for r in ok)
    end = min(r["chunk_times"][-1] for r in ok)
    if end - start >= min_window_s:
        tokens = 0.0
        counts = []
        for r in ok:
            inside = sum(1 for t in r["chunk_times"] if start < t <= end)
            counts.append(inside)
            tokens += inside * (r["completion_tokens"] or r["token_chunks"]) / max(1, r["token_chunks"])
        if min(counts) >= min_chunks:
            return {"method": "window", "window_s": end - start, "aggregate_tps": tokens / (end - start)}
    first = min(r["chunk_times"][0] for r in ok)
    last = max(r["chunk_times"][-1] for r in ok)
    tokens = sum(max(0, (r["completion_tokens"] or r["token_chunks"]) - 1) for r in ok)
    return {"method": "span", "window_s": last - first, "aggregate_tps": tokens / (last - first) if last > first else None}


def workload_decode(run: Run) -> dict[str, Any]:
    a = run.a
    n = a.decode_streams
    ctx = a.decode_ctx_size or _round_up(n * (max(a.decode_contexts) + a.decode_tokens + 256), 1024)
    out: dict[str, Any] = {"settings": {"decode_tokens": a.decode_tokens, "contexts": a.decode_contexts,
                                        "streams": n, "np": n, "ctx": ctx, "endpoint": "/v1/completions"},
                           "servers": {}}
    for server in a.servers:
        res: dict[str, Any] = {"contexts": {}}
        out["servers"][server] = res
        with Served(run, server, n, ctx, "decode") as srv:
            res["server"] = srv.info
            if not srv.ok:
                continue
            for c in a.decode_contexts:
                if run.budget.spent():
                    res["stopped"] = "time budget spent"
                    break
                prompts = [run.texts.text("prose", f"decode-{c}-{i}", c) for i in range(n)]
                entry: dict[str, Any] = {}
                res["contexts"][str(c)] = entry
                # prefill each prompt once (1 token), so the measured requests find them cached and
                # their streams decode side by side instead of waiting for each other's prefill
                warm = [stream(srv.url, "/v1/completions", {**sampling_body(a, 1), "prompt": p},
                               timeout=run.timeout()) for p in prompts]
                entry["prefill"] = [request_record(r) for r in warm]
                body = {**sampling_body(a, a.decode_tokens)}
                one = stream(srv.url, "/v1/completions", {**body, "prompt": prompts[0]}, timeout=run.timeout(),
                             keep_chunk_times=True)
                entry["streams_1"] = {"request": request_record(one), "decode_tps": one.get("decode_tps"),
                                      "server_predicted_per_second": (one.get("timings") or {}).get(
                                          "predicted_per_second")}
                many: list[dict] = [{} for _ in range(n)]
                barrier = threading.Barrier(n)

                def go(i: int, barrier=barrier, many=many, body=body, prompts=prompts) -> None:
                    barrier.wait()
                    many[i] = stream(srv.url, "/v1/completions", {**body, "prompt": prompts[i]},
                                     timeout=run.timeout(), keep_chunk_times=True)

                before = srv.counters()
                threads = [threading.Thread(target=go, args=(i,), daemon=True) for i in range(n)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(run.timeout() + 5)
                after = srv.counters()
                delta = {k: after[k] - before.get(k, 0.0) for k in after}
                many = [m if m else {"ok": False, "error": "no result"} for m in many]
                win = decode_window(many)
                per = [m.get("decode_tps") for m in many]
                entry[f"streams_{n}"] = {
                    "requests": [request_record(m) for m in many],
                    "per_stream_decode_tps": per,
                    "per_stream_decode_tps_p50": bc.percentile(per, 50),
                    "sum_of_stream_tps": sum(p for p in per if p) if all(per) else None,
                    "window_s": win["window_s"],
                    "aggregate_tps": win["aggregate_tps"],
                    "aggregate_method": win["method"],
                    "server_predicted_per_second": [(m.get("timings") or {}).get("predicted_per_second")
                                                    for m in many],
                    "server_counters_delta": delta,
                    # warmslot: generated tokens per second of engine decode time (all streams together)
                    "server_engine_aggregate_tps": (delta["warmslot_decode_tokens_total"]
                                                    / delta["warmslot_decode_seconds_total"])
                    if delta.get("warmslot_decode_seconds_total") else None,
                }
                e = entry[f"streams_{n}"]
                run.log(f"  {server:12s} decode ctx {c}: 1 stream {one.get('decode_tps') or 0:.1f} tok/s; "
                        f"{n} streams {e['aggregate_tps'] or 0:.1f} tok/s aggregate "
                        f"({e['per_stream_decode_tps_p50'] or 0:.1f} per stream)")
                run.save()
            res.update(srv.scrape())
        run.save()
    return out


# ============================================================================================
# main

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("-m", "--model", required=True, help="GGUF model")
    p.add_argument("--shape", default=None, help="name of the model's shape (e.g. qwen3-8b), recorded in the JSON")
    p.add_argument("--out", required=True, help="result JSON")
    p.add_argument("--workloads", default="agent,alternating,concurrent,decode,restore",
                   help=f"comma-separated: {','.join(WORKLOADS)}")
    p.add_argument("--servers", default=",".join(SERVERS), help="comma-separated, run in this order")
    p.add_argument("--llama-server", default=None, help="llama-server binary (default: PATH, then build/llama.cpp/bin)")
    p.add_argument("--python", default=sys.executable, help="interpreter that runs warmslot")
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
    p.add_argument("--no-kv-unified", dest="kv_unified", action="store_false",
                   help="do not pass -kvu to llama-server when -np > 1 (then each slot gets ctx/np)")
    p.add_argument("--warmslot-args", default="", help="extra warmslot flags (one string)")
    p.add_argument("--llama-server-args", default="", help="extra llama-server flags (one string)")
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
    return a


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
    order = [w for w in WORKLOADS if w in a.workloads]
    if "restore" in order and "alternating" not in order:
        order.insert(order.index("restore"), "alternating")
    runners = {"agent": workload_agent, "alternating": workload_alternating,
               "concurrent": workload_concurrent, "decode": workload_decode}
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
                run.result["workloads"][name] = runners[name](run)
        except Exception as exc:  # noqa: BLE001 - one workload's failure does not end the run
            run.result["errors"].append({"workload": name, "error": f"{type(exc).__name__}: {exc}",
                                         "traceback": traceback.format_exc()[-4000:]})
            run.log(f"workload {name} failed: {exc}")
        if isinstance(run.result["workloads"].get(name), dict):
            run.result["workloads"][name]["wall_s"] = round(time.perf_counter() - t0, 2)
        run.result["model"]["meta"] = run.model_meta
        run.save()
    run.save()
    print_summary(run.result)
    print(f"\nwrote {a.out}")
    return 0


def print_summary(result: dict[str, Any]) -> None:
    w = result.get("workloads") or {}
    rows = []
    for server, res in ((w.get("agent") or {}).get("servers") or {}).items():
        for mode, m in (res.get("modes") or {}).items():
            s = m["summary"]
            rows.append([server, mode, s["turns_ok"], s["prompt_tokens_total"], s["computed_tokens_total"],
                         s["ideal_computed_total"], (s["ttft_s_p50_turn2plus"] or 0) * 1000, s["wall_s"],
                         s.get("wall_s_first_k")])
    if rows:
        print("\nagent replay")
        print(bc.format_table(["server", "mode", "turns", "prompt", "computed", "ideal", "TTFT p50 2+ ms",
                               "wall s", "wall first k"], rows))
    rows = []
    for server, res in ((w.get("alternating") or {}).get("servers") or {}).items():
        s = res.get("summary") or {}
        rows.append([server, s.get("ok"), (s.get("ttft_s_p50_first") or 0) * 1000,
                     (s.get("ttft_s_p50_returns") or 0) * 1000, s.get("computed_tokens_returns")])
    if rows:
        print("\nalternating")
        print(bc.format_table(["server", "requests", "TTFT p50 first ms", "TTFT p50 returns ms",
                               "computed on returns"], rows))
    rows = []
    for server, res in ((w.get("concurrent") or {}).get("servers") or {}).items():
        s = res.get("summary") or {}
        rows.append([server, s.get("ok"), res.get("wall_s"), s.get("generated_tokens_per_wall_s"),
                     s.get("decode_tps_per_request_p50"), (s.get("ttft_s_p50") or 0) * 1000,
                     (s.get("ttft_s_p95") or 0) * 1000])
    if rows:
        print("\nconcurrent")
        print(bc.format_table(["server", "requests", "wall s", "gen tok/wall s", "decode p50", "TTFT p50 ms",
                               "TTFT p95 ms"], rows))
    rows = []
    for server, res in ((w.get("decode") or {}).get("servers") or {}).items():
        for c, e in (res.get("contexts") or {}).items():
            many = next((v for k, v in e.items() if k.startswith("streams_") and k != "streams_1"), {})
            rows.append([server, c, (e.get("streams_1") or {}).get("decode_tps"), many.get("aggregate_tps"),
                         many.get("per_stream_decode_tps_p50")])
    if rows:
        print("\ndecode")
        print(bc.format_table(["server", "context", "1 stream tok/s", "N streams aggregate", "per stream"], rows))
    r = (w.get("restore") or {}).get("servers", {}).get(WARMSLOT)
    if r:
        print(f"\nrestore (warmslot): loaded {r.get('prompt_cache_loaded_bytes')} B in "
              f"{r.get('prompt_cache_load_seconds')} s = {r.get('load_gb_per_s')} GB/s; checkpoints restored "
              f"{r.get('checkpoints_restored')}")


if __name__ == "__main__":
    sys.exit(main())
