"""Record what the OpenAI Codex CLI sends to a custom `/v1/responses` provider.

A small stub server answers Codex with scripted Responses-API event streams and writes every
request body it gets to OUT_DIR (`NN-<role>.json`, in arrival order). `codex exec` runs
against it with a custom model provider (a temporary CODEX_HOME holding
`model_providers.stub = {base_url, wire_api = "responses", env_key}`), twice:

1. `codex exec "<task>"`: the stub answers the first request with a reasoning item and a
   shell call, the request with its output with a reasoning item and a subagent spawn through
   the `multi_agent_v1` namespace tool (`{"type": "function_call", "namespace":
   "multi_agent_v1", "name": "spawn_agent", ...}`), the subagent's request with a message, and
   the main agent's next request with its final message;
2. `codex exec resume <session id> "<follow-up>"`: a second turn of the same session, which
   resends the whole history, reasoning items included (Codex sends `store: false` and asks
   for `reasoning.encrypted_content`).

The stub's reasoning items carry a fake `encrypted_content`: what Codex resends of them is what
the fixtures test. Re-capture (Node.js and the pinned Codex CLI installed, as
tests/install_deps.sh does):

    python scripts/codex_capture.py tests/data/codex

The stub answers with the tools' names it finds in each request, so a Codex release that
renames its shell tool still gets a call; one that drops the namespace tool gets no spawn.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

TASK = "Run `echo warmslot` in the shell, then ask a subagent to check the result, then say done."
FOLLOW_UP = "Now say which command you ran."
SUBTASK = "SUBTASK: reply with the word checked."
SHELL_NAMES = ("exec_command", "shell_command", "shell")
NAMESPACE = "multi_agent_v1"


# -- scripted answers -----------------------------------------------------------------------


def function_names(body: dict) -> tuple[set[str], dict[str, set[str]]]:
    """(top-level function names, namespace -> its function names) of a request's tools."""
    top, spaces = set(), {}
    for tool in body.get("tools") or []:
        if tool.get("type") == "function":
            top.add(tool.get("name"))
        elif tool.get("type") == "namespace":
            spaces[tool.get("name")] = {t.get("name") for t in tool.get("tools") or []}
    return top, spaces


def user_texts(body: dict) -> list[str]:
    texts = []
    for item in body.get("input") or []:
        if item.get("type", "message") == "message" and item.get("role") == "user":
            content = item.get("content")
            parts = content if isinstance(content, list) else [{"text": content}]
            texts.append("".join(p.get("text") or "" for p in parts if isinstance(p, dict)))
    return texts


def outputs_since_last_user(body: dict) -> int:
    count = 0
    for item in body.get("input") or []:
        if item.get("type", "message") == "message" and item.get("role") == "user":
            count = 0
        elif item.get("type") == "function_call_output":
            count += 1
    return count


def reasoning(n: int) -> dict:
    return {"type": "reasoning", "id": f"rs_stub{n}", "summary": [{"type": "summary_text", "text": f"Step {n}."}],
            "content": [{"type": "reasoning_text", "text": f"Thinking about step {n}."}], "encrypted_content": f"stub-blob-{n}"}


def message(n: int, text: str) -> dict:
    return {"type": "message", "id": f"msg_stub{n}", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def call(n: int, name: str, arguments: dict, namespace: str | None = None) -> dict:
    # a call id of 9 letters and digits, as every template takes (Mistral's insist on that)
    item = {"type": "function_call", "id": f"fc_stub{n}", "call_id": f"call{n:05d}", "name": name,
            "arguments": json.dumps(arguments), "status": "completed"}
    if namespace is not None:
        item["namespace"] = namespace
    return item


def script(body: dict, n: int) -> tuple[str, list[dict]]:
    """(the request's role in the session, the output items that answer it)."""
    texts = user_texts(body)
    last = texts[-1] if texts else ""
    if SUBTASK in last:
        return "subagent", [reasoning(n), message(n, "checked")]
    top, spaces = function_names(body)
    done = outputs_since_last_user(body)
    if FOLLOW_UP in last:
        return ("resume", [reasoning(n), message(n, "I ran `echo warmslot`.")]) if done == 0 else ("resume-end", [message(n, "Done.")])
    if done == 0:
        shell = next((name for name in SHELL_NAMES if name in top), None)
        if shell is None:
            return "main-first", [message(n, f"no shell tool among {sorted(top)}")]
        args = {"cmd": "echo warmslot"} if shell == "exec_command" else {"command": ["echo", "warmslot"] if shell == "shell" else "echo warmslot"}
        return "main-first", [reasoning(n), call(n, shell, args)]
    if done == 1 and "spawn_agent" in spaces.get(NAMESPACE, ()):
        return "main-shell-output", [reasoning(n), call(n, "spawn_agent", {"message": SUBTASK}, NAMESPACE)]
    return "main-end", [reasoning(n), message(n, "done")]


def events(n: int, items: list[dict]) -> list[dict]:
    response = {"id": f"resp_stub{n}", "object": "response", "status": "in_progress", "output": []}
    out = [{"type": "response.created", "response": response}]
    for index, item in enumerate(items):
        out.append({"type": "response.output_item.added", "output_index": index, "item": {**item, "status": "in_progress"}})
        if item["type"] == "message":
            text = item["content"][0]["text"]
            out.append({"type": "response.output_text.delta", "item_id": item["id"], "output_index": index, "content_index": 0, "delta": text})
        out.append({"type": "response.output_item.done", "output_index": index, "item": item})
    usage = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 5,
             "output_tokens_details": {"reasoning_tokens": 2}, "total_tokens": 15}
    out.append({"type": "response.completed", "response": {**response, "status": "completed", "output": items, "usage": usage}})
    return out


# -- the stub server ------------------------------------------------------------------------------


class Recorder:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.count = 0
        self.lock = threading.Lock()
        self.roles: list[str] = []

    def record(self, body: dict) -> list[dict]:
        with self.lock:
            self.count += 1
            n = self.count
            role, items = script(body, n)
            self.roles.append(role)
            (self.out / f"{n:02d}-{role}.json").write_text(json.dumps(body, indent=1, ensure_ascii=False) + "\n")
        return events(n, items)


def handler(recorder: Recorder):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length)
            if not self.path.rstrip("/").endswith("/responses"):
                self.send_error(404)
                return
            body = json.loads(raw)
            stream = events_text(recorder.record(body))
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("content-length", str(len(stream)))
            self.end_headers()
            self.wfile.write(stream)

        def do_GET(self) -> None:  # noqa: N802
            self.send_error(404)

        def log_message(self, *args) -> None:
            pass

    return Handler


def events_text(items: list[dict]) -> bytes:
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in items).encode()


# -- driving Codex ------------------------------------------------------------------------------


def codex_home(root: Path, base_url: str) -> Path:
    """A CODEX_HOME whose config points Codex at `base_url` (the Responses wire API)."""
    home = root / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(
        'model = "local"\nmodel_provider = "stub"\nsandbox_mode = "danger-full-access"\n\n'
        "[model_providers.stub]\n"
        f'name = "stub"\nbase_url = "{base_url}"\nwire_api = "responses"\nenv_key = "STUB_API_KEY"\n'
    )
    return home


def run_codex(codex: str, home: Path, work: Path, args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "CODEX_HOME": str(home), "STUB_API_KEY": "unused", "HOME": str(home.parent)}
    cmd = [codex, "exec", "--skip-git-repo-check", *args]
    return subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=300)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="folder for the request bodies (emptied first)")
    ap.add_argument("--codex", default=shutil.which("codex"), help="the codex executable")
    args = ap.parse_args(argv)
    if not args.codex:
        ap.error("codex is not installed (npm install -g @openai/codex)")
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("[0-9][0-9]-*.json"):
        old.unlink()
    recorder = Recorder(args.out)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler(recorder))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            home = codex_home(root, base_url)
            work = root / "work"
            work.mkdir()
            version = subprocess.run([args.codex, "--version"], capture_output=True, text=True).stdout.strip()
            first = run_codex(args.codex, home, work, [TASK])
            print(f"codex exec: exit {first.returncode}\n{first.stdout[-2000:]}{first.stderr[-3000:]}", file=sys.stderr)
            # the main agent's session (the subagent's is newer: `--last` would pick it)
            session = re.search(r"session id: (\S+)", first.stdout + first.stderr)
            second = run_codex(args.codex, home, work, ["resume", session.group(1) if session else "--last", FOLLOW_UP])
            print(f"codex exec resume: exit {second.returncode}\n{second.stdout[-2000:]}{second.stderr[-3000:]}", file=sys.stderr)
    finally:
        server.shutdown()
    print(f"{version}: {recorder.count} requests: {', '.join(recorder.roles)}")
    return 0 if first.returncode == 0 and second.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
