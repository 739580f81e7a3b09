"""Start the real server (`python -m warmslot.server`) on a loopback port for end-to-end tests."""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx

_live: set[subprocess.Popen] = set()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, model: str, *args: str, env: dict | None = None, wait: bool = True) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="warmslot-", suffix=".log", delete=False)
        cmd = [sys.executable, "-m", "warmslot.server", "-m", str(model), "--port", str(self.port), "-t", "2", *args]
        self.proc = subprocess.Popen(
            cmd, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, start_new_session=True
        )
        _live.add(self.proc)
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"the server did not become ready:\n{self.output()}")

    def output(self) -> str:
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        _live.discard(self.proc)
        self.log.close()
        os.unlink(self.log.name)


@atexit.register
def _kill_leftovers() -> None:
    for proc in list(_live):
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
