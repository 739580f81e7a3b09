#!/usr/bin/env python3
"""Capture the requests the Claude Code CLI really sends, as test fixtures (stdlib only).

The CLI is pointed (ANTHROPIC_BASE_URL) at a small recording stub of Anthropic's Messages API
that writes down every request it gets and answers from a script, so one headless session
exercises what Claude Code does on a real model:

1. `claude -p TASK`: the main agent starts two subagents in one turn (two parallel `Agent`
   tool calls); each subagent reads a file (`Read`) and reports; the main agent then loads
   the web tools (`ToolSearch`), fetches a page from the stub (`WebFetch`, which sends a
   request of its own to summarise the page), searches (`WebSearch`, answered without
   results: no network) and answers.
2. `claude -p --resume ID /compact`: the compaction request.
3. `claude -p --resume ID NEXT`: the first request after the compaction, then `/context`,
   which counts tokens (`/v1/messages/count_tokens`).
4. `claude -p --model claude-sonnet-4-6 TODO`: the task list (`TaskCreate`, `TaskUpdate`,
   loaded through `ToolSearch`), which the CLI offers only to the model names it lists.
5. The session-title request (structured output: `output_config.format`), as an SDK host
   asks for it (a `generate_session_title` control request on a stream-json stdin).

Each request is written to OUT/NN-<kind>.json as {"path", "headers" (the Anthropic ones and
the user agent), "body"}; bodies are kept whole. The stub answers in SSE when the request
streams. Run it again whenever the CLI pin moves (tests/install_deps.sh):

    npm install --prefix /tmp/cc @anthropic-ai/claude-code@VERSION
    python scripts/capture_claude_code.py --claude /tmp/cc/node_modules/.bin/claude \\
        --out tests/data/claude_code
"""

from __future__ import annotations

import argparse
import http.server
import itertools
import json
import os
import pathlib
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading

KEPT_HEADERS = ("anthropic-beta", "anthropic-version", "user-agent", "x-app")
MAIN_TASK = "MAIN-TASK: start two Explore subagents on notes.txt, then fetch the project page, then answer."
NEXT_TASK = "MAIN-NEXT: one more question after the compaction. Answer in one word."
TITLE_TASK = "TITLE-TASK: rename the parse_config helper in config.py"
TODO_TASK = "TODO-TASK: track one task in the task list, then finish it."
TODO_MODEL = "claude-sonnet-4-6"
NOTES = "line one of the notes\nline two of the notes\n"
PAGE = "<html><body><h1>Project page</h1><p>The project keeps prefixes warm.</p></body></html>"
ALLOWED_TOOLS = "Agent,Read,Glob,Grep,Bash,ToolSearch,WebFetch,WebSearch,TodoWrite"  # never asked for
SUBAGENT = re.compile(r"SUBAGENT-(\d)")
COMPACT = re.compile(r"^CRITICAL: Respond with TEXT ONLY")


def _texts(content) -> list[str]:
    if isinstance(content, str):
        return [content]
    out = []
    for block in content or []:
        if block.get("type") == "text":
            out.append(block["text"])
        elif block.get("type") == "tool_result":
            inner = block.get("content")
            out += _texts(inner) if isinstance(inner, list) else [str(inner)]
    return out


def _user_text(body: dict) -> str:
    return "\n".join(t for m in body.get("messages", []) if m["role"] == "user" for t in _texts(m["content"]))


def _first_user_text(body: dict) -> str:
    first = next((m for m in body.get("messages", []) if m["role"] == "user"), None)
    return "\n".join(_texts(first["content"])) if first else ""


def _turns(body: dict) -> int:
    return sum(1 for m in body.get("messages", []) if m["role"] == "assistant")


def _tool_names(body: dict) -> set[str]:
    return {t.get("name") for t in body.get("tools") or []}


class Script:
    """Which request a body is, and the reply it gets: ("text", str), ("tools", [(name,
    input)]) or ("json", value)."""

    def __init__(self, page_url: str, project: str) -> None:
        self.page_url = page_url
        self.project = project

    def kind(self, body: dict) -> str:
        """title, subagent<N>, compact, main, todos, webfetch, websearch or other."""
        if (body.get("output_config") or {}).get("format") or body.get("output_format"):
            return "title"  # the one structured-output request the CLI sends
        first, text = _first_user_text(body), _user_text(body)
        last = "\n".join(_texts(body["messages"][-1]["content"])) if body.get("messages") else ""
        if SUBAGENT.search(first):
            return f"subagent{SUBAGENT.search(first).group(1)}"
        if COMPACT.search(last):
            return "compact"
        if "MAIN-" in text:
            return "main"
        if "TODO-TASK" in first:
            return "todos"
        if "Project page" in text:
            return "webfetch"
        if any(t.get("type", "").startswith("web_search") for t in body.get("tools") or []):
            return "websearch"
        return "other"

    def reply(self, kind: str, body: dict):
        if kind == "title":
            return ("json", _instance(_schema_of(body)))
        if kind.startswith("subagent"):
            n = kind[-1]
            if _turns(body) == 0:
                return ("tools", [("Read", {"file_path": f"{self.project}/notes.txt"})])
            return ("text", f"SUBAGENT-{n} report: notes.txt has two lines.")
        if kind == "compact":
            return ("text", "<summary>The user asked for two subagents and a page fetch; all done.</summary>")
        if kind == "websearch":
            return ("text", "No results: the search ran off-line.")
        if kind == "webfetch":
            return ("text", "The page says the project keeps prefixes warm.")
        if kind == "main":
            return self._main(body)
        if kind == "todos":
            return self._todos(body)
        return ("text", "OK")

    def _main(self, body: dict):
        if "MAIN-NEXT" in _user_text(body):
            return ("text", "Done.")
        done = _tool_uses(body)
        if "Agent" not in done:
            return ("tools", [
                ("Agent", {"description": f"Read notes {i}", "subagent_type": "Explore",
                           "prompt": f"SUBAGENT-{i}: read notes.txt in {self.project} and report its line count."})
                for i in (1, 2)
            ])
        if "ToolSearch" not in done:
            return ("tools", [("ToolSearch", {"query": "select:WebFetch,WebSearch"})])
        if "WebFetch" not in done and "WebFetch" in _tool_names(body):
            return ("tools", [("WebFetch", {"url": self.page_url, "prompt": "What does the page say?"})])
        if "WebSearch" not in done and "WebSearch" in _tool_names(body):
            return ("tools", [("WebSearch", {"query": "warm prefix cache"})])
        return ("text", "MAIN-DONE: both subagents reported two lines; the page says prefixes stay warm.")


    def _todos(self, body: dict):
        done = _tool_uses(body)
        if "ToolSearch" not in done:
            return ("tools", [("ToolSearch", {"query": "select:TaskCreate,TaskUpdate"})])
        if "TaskCreate" not in done:
            return ("tools", [("TaskCreate", {"subject": "Count the notes", "description": "Count the lines of notes.txt"})])
        if "TaskUpdate" not in done:
            return ("tools", [("TaskUpdate", {"taskId": "1", "status": "completed"})])
        return ("text", "TODO-DONE")


def _tool_uses(body: dict) -> set[str]:
    return {b.get("name") for m in body.get("messages", []) if m["role"] == "assistant" and isinstance(m["content"], list)
            for b in m["content"] if b.get("type") == "tool_use"}


def _schema_of(body: dict) -> dict:
    fmt = (body.get("output_config") or {}).get("format") or body.get("output_format") or {}
    return fmt.get("schema") or {}


def _instance(schema: dict):
    """A small value of `schema` (objects, strings, integers, booleans, arrays)."""
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties") or {}
        return {k: ("Claude Code fixture session" if k == "title" else _instance(v)) for k, v in props.items()
                if k in schema.get("required", props)}
    if kind == "array":
        return []
    if kind in ("integer", "number"):
        return 1
    if kind == "boolean":
        return True
    return "x"


class Stub(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, out: pathlib.Path, script: Script) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.out = out
        self.script = script
        self.numbers = itertools.count()
        self.lock = threading.Lock()
        self.seen: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def record(self, path: str, headers, body: dict, kind: str) -> None:
        with self.lock:
            n = next(self.numbers)
            self.seen.append(kind)
        kept = {k.lower(): v for k, v in headers.items() if k.lower() in KEPT_HEADERS}
        name = self.out / f"{n:02d}-{kind}.json"
        name.write_text(json.dumps({"path": path, "headers": kept, "body": body}, indent=1, ensure_ascii=False) + "\n")


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Stub

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:  # the page WebFetch fetches
        data = PAGE.encode()
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("content-length", 0)))
        body = json.loads(raw)
        if "/count_tokens" in self.path:
            self.server.record(self.path, self.headers, body, "count_tokens")
            return self._json({"input_tokens": len(raw) // 4})
        kind = self.server.script.kind(body)
        self.server.record(self.path, self.headers, body, kind)
        reply = self.server.script.reply(kind, body)
        message = _message(body, reply)
        if body.get("stream"):
            self._stream(message)
        else:
            self._json(message)

    def _json(self, value: dict) -> None:
        data = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, message: dict) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        for name, data in _events(message):
            self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
        self.wfile.flush()
        self.close_connection = True


_ids = itertools.count()


def _message(body: dict, reply) -> dict:
    kind, value = reply
    if kind == "tools":
        content = [{"type": "tool_use", "id": f"toolu_{next(_ids):04d}", "name": name, "input": args} for name, args in value]
        stop = "tool_use"
    else:
        content = [{"type": "text", "text": json.dumps(value) if kind == "json" else value}]
        stop = "end_turn"
    usage = {"input_tokens": 100, "output_tokens": 10, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}
    return {"id": f"msg_{next(_ids):04d}", "type": "message", "role": "assistant", "model": body.get("model", ""),
            "content": content, "stop_reason": stop, "stop_sequence": None, "usage": usage}


def _events(message: dict):
    start = dict(message, content=[], stop_reason=None)
    yield "message_start", {"type": "message_start", "message": start}
    for i, block in enumerate(message["content"]):
        if block["type"] == "text":
            yield "content_block_start", {"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}}
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            yield "content_block_start", {"type": "content_block_start", "index": i, "content_block": dict(block, input={})}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        yield "content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta}
        yield "content_block_stop", {"type": "content_block_stop", "index": i}
    yield "message_delta", {"type": "message_delta", "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                            "usage": {"output_tokens": 10}}
    yield "message_stop", {"type": "message_stop"}


# -- driving the CLI ----------------------------------------------------------------------------


class _PageHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        data = PAGE.encode()
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def page_server(folder: pathlib.Path) -> http.server.ThreadingHTTPServer:
    """The page WebFetch fetches, over HTTPS (WebFetch upgrades HTTP) with a self-signed
    certificate for 127.0.0.1, which the CLI is told to trust (NODE_EXTRA_CA_CERTS)."""
    cert, key = folder / "page.crt", folder / "page.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _PageHandler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def cli_env(home: pathlib.Path, url: str) -> dict[str, str]:
    """Offline: no telemetry, no update checks, no other traffic; a dummy key; WebFetch
    without its domain check (which asks claude.ai)."""
    (home / ".claude").mkdir(exist_ok=True)
    (home / ".claude" / "settings.json").write_text(json.dumps({"skipWebFetchPreflight": True}))
    return {
        "NODE_EXTRA_CA_CERTS": str(home / "page.crt"),
        "PATH": os.environ.get("PATH", ""), "HOME": str(home), "TERM": "xterm-256color",
        "ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": "sk-fixture",
        "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_ERROR_REPORTING": "1",
    }


def headless(claude: str, args: list[str], cwd: pathlib.Path, env: dict) -> dict:
    run = subprocess.run([claude, "-p", *args, "--output-format", "json", "--allowedTools", ALLOWED_TOOLS],
                         cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    try:
        return json.loads(run.stdout)
    except ValueError:
        raise SystemExit(f"claude {args} printed no JSON result:\n{run.stdout}\n{run.stderr}") from None


def session_title(claude: str, description: str, cwd: pathlib.Path, env: dict) -> str:
    """The session-title request, as an SDK host (an IDE, the desktop app) asks for it: a
    `generate_session_title` control request on a stream-json stdin."""
    request = {"type": "control_request", "request_id": "title-1",
               "request": {"subtype": "generate_session_title", "description": description, "persist": False}}
    proc = subprocess.Popen([claude, "-p", "--input-format", "stream-json", "--output-format", "stream-json", "--verbose"],
                            cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(request) + "\n")
    proc.stdin.flush()
    try:
        for line in proc.stdout:
            event = json.loads(line)
            if event.get("type") == "control_response":
                return event["response"].get("response", {}).get("title", "")
        raise SystemExit("claude closed its output before answering the title request")
    finally:
        proc.kill()
        proc.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--claude", default=shutil.which("claude") or "claude", help="the CLI to run")
    ap.add_argument("--out", type=pathlib.Path, required=True, help="the fixture folder (its *.json are replaced)")
    ap.add_argument("--steps", default="session,compact,next,todos,title", help="which steps to run")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("*.json"):
        old.unlink()
    with tempfile.TemporaryDirectory() as tmp:
        home, project = pathlib.Path(tmp, "home"), pathlib.Path(tmp, "project")
        home.mkdir()
        project.mkdir()
        (project / "notes.txt").write_text(NOTES)
        pages = page_server(home)
        stub = Stub(args.out, Script(f"https://127.0.0.1:{pages.server_address[1]}/page.html", str(project)))
        threading.Thread(target=stub.serve_forever, daemon=True).start()
        env = cli_env(home, stub.url)
        steps = args.steps.split(",")
        session = None
        if "session" in steps:
            result = headless(args.claude, [MAIN_TASK], project, env)
            session = result["session_id"]
            print(f"session {session}: {result.get('result')!r}", file=sys.stderr)
        if "compact" in steps and session:
            headless(args.claude, ["--resume", session, "/compact"], project, env)
        if "next" in steps and session:
            headless(args.claude, ["--resume", session, NEXT_TASK], project, env)
            headless(args.claude, ["--resume", session, "/context"], project, env)
        if "todos" in steps:  # the task tools are offered to older model names only
            headless(args.claude, ["--model", TODO_MODEL, TODO_TASK], project, env)
        if "title" in steps:
            print(f"title: {session_title(args.claude, TITLE_TASK, project, env)!r}", file=sys.stderr)
        stub.shutdown()
        pages.shutdown()
        print("captured: " + ", ".join(stub.seen), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
