"""Server child processes on a free loopback port, for the benchmarks and the tests alike (stdlib + httpx only).

warmslot (`python -m warmslot.server`) and llama-server are started the same way: in their own
process group, output to a log file, polled on /health until ready, and always stopped with
their whole group, also when the parent exits or is terminated.

    cmd = warmslot_command(model, ["-np", "1", "-c", "4096"])
    with ServerProcess("warmslot", cmd) as srv:
        httpx.post(srv.url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 8})
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_LLAMA_SERVER = REPO_ROOT / "build" / "llama.cpp" / "bin" / "llama-server"

_live: set[subprocess.Popen] = set()


def _kill_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


@atexit.register
def _kill_leftovers() -> None:
    for proc in list(_live):
        if proc.poll() is None:
            _kill_group(proc, signal.SIGKILL)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        _live.discard(proc)


def _on_signal(signum, frame):
    _kill_leftovers()
    raise SystemExit(128 + signum)


def install_signal_handlers() -> None:
    """Make SIGTERM/SIGHUP stop the child servers too (SIGINT already unwinds via KeyboardInterrupt)."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            signal.signal(sig, _on_signal)
        except (ValueError, OSError):  # not the main thread, or unsupported
            pass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def warmslot_command(model: str | os.PathLike, args: Sequence[str] = (), python: str | None = None) -> list[str]:
    """The command line of a warmslot server (without --host/--port, which ServerProcess adds)."""
    return [python or sys.executable, "-m", "warmslot.server", "-m", str(model), *args]


def llama_server_command(
    model: str | os.PathLike, args: Sequence[str] = (), binary: str | os.PathLike | None = None
) -> list[str]:
    """The command line of a llama-server (without --host/--port, which ServerProcess adds)."""
    return [str(binary or DEFAULT_LLAMA_SERVER), "-m", str(model), *args]


def start_together(servers: Sequence[ServerProcess]) -> None:
    """Start servers made with start=False side by side (they load at once); if one fails,
    all are stopped."""
    try:
        for server in servers:
            server.launch()
        for server in servers:
            server.finish_start()
    except BaseException:
        for server in servers:
            server.stop()
        raise


def vllm_router_command(worker_urls: Sequence[str], args: Sequence[str] = ()) -> list[str]:
    """The command line of vllm-router (the `test` extra installs it) in front of `worker_urls`
    (without --host/--port, which ServerProcess adds)."""
    here = os.path.dirname(sys.executable)
    binary = shutil.which("vllm-router", path=here) or shutil.which("vllm-router") or "vllm-router"
    return [binary, "--worker-urls", *worker_urls, *args]


def source_env(src: str | None) -> dict[str, str] | None:
    """The environment that runs warmslot from the source tree `src` (a folder holding a
    `warmslot` package) ahead of the installed one; None for the installed one."""
    if not src:
        return None
    return {"PYTHONPATH": os.pathsep.join(filter(None, (src, os.environ.get("PYTHONPATH"))))}


def host_port_args(host: str, port: int) -> list[str]:
    return ["--host", host, "--port", str(port)]


class ServerProcess:
    """One server process on a free loopback port; a context manager that always stops it.

    `cmd` must accept `--host H --port P` (warmslot, llama-server and vllm-router do), or
    `listen(host, port)` gives the arguments that say where to listen (Prometheus:
    `--web.listen-address`). Ready when `ready_path` answers 200. Output goes to a log file
    (kept at `log_path` when given, else a temporary file removed on stop).
    """

    def __init__(
        self,
        name: str,
        cmd: Sequence[str],
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        env: dict[str, str] | None = None,
        cwd: str | os.PathLike | None = None,
        log_path: str | os.PathLike | None = None,
        ready_timeout: float = 300.0,
        start: bool = True,
        listen: Callable[[str, int], list[str]] = host_port_args,
        ready_path: str = "/health",
    ) -> None:
        self.name = name
        self.host = host
        self.port = port or free_port(host)
        self.url = f"http://{host}:{self.port}"
        self.cmd = [*cmd, *listen(host, self.port)]
        self.ready_path = ready_path
        self.env = {**os.environ, **(env or {})}
        self.cwd = str(cwd or REPO_ROOT)
        self._keep_log = log_path is not None
        if log_path is not None:
            Path(log_path).parent.mkdir(parents=True, exist_ok=True)
            self.log_path = Path(log_path)
        else:
            fd, tmp = tempfile.mkstemp(prefix=f"server-{name}-", suffix=".log")
            os.close(fd)
            self.log_path = Path(tmp)
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen | None = None
        self.load_s: float | None = None
        if start:
            self.start()

    def start(self) -> ServerProcess:
        self.launch()
        return self.finish_start()

    def launch(self) -> None:
        """Start the process without waiting for it to be ready (see start_together)."""
        self._t0 = time.perf_counter()
        with open(self.log_path, "w") as log:
            self.proc = self._spawn(log)
        _live.add(self.proc)

    def _spawn(self, log) -> subprocess.Popen:
        """The process of `cmd`, its output in `log`, in a session of its own (a subclass may
        start it otherwise, as the tests' forked servers do)."""
        return subprocess.Popen(
            self.cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            cwd=self.cwd,
            start_new_session=True,  # own process group: stop() takes every child with it
        )

    def finish_start(self) -> ServerProcess:
        """Wait until ready (stopping the process if it never is)."""
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        self.load_s = time.perf_counter() - self._t0
        return self

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        assert self.proc is not None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode} before it was ready:\n{self.output_tail()}"
                )
            try:
                if httpx.get(self.url + self.ready_path, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{self.name} was not ready after {self.ready_timeout:.0f}s:\n{self.output_tail()}")

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def pgid(self) -> int | None:
        """The server's process group (it leads its own session): for CPU accounting."""
        return self.pid

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def output_tail(self, n: int = 40) -> str:
        return "\n".join(self.output().splitlines()[-n:])

    def stop(self, timeout: float = 15.0) -> int | None:
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            _kill_group(proc, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _kill_group(proc, signal.SIGKILL)
                proc.wait(5)
        else:
            _kill_group(proc, signal.SIGKILL)  # stray children of an exited leader
        _live.discard(proc)
        if not self._keep_log:
            try:
                self.log_path.unlink()
            except FileNotFoundError:
                pass
        return proc.returncode

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
