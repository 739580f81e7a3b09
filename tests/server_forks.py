"""Server processes forked from one process that has imported the server's modules already
(stdlib only).

A fresh `python -m warmslot.server` spends most of its start (about half a second on two
cores) importing llama.cpp's bindings, numpy, starlette and its own modules; the model load
that follows takes a fraction of that on the tiny models of the tests. A test harness that
starts a server per test (llama.cpp's server suite: hundreds of them; this repository's own
tests, through `helpers.warmslot_server`) starts them here instead: each request forks a child of the one process that imported everything, and the
child runs the server's `__main__` with the request's arguments, environment, working folder
and standard streams. Each server is still a new process with nothing in it from another
(the parent never loads a model, serves or starts a thread), so a test sees what it would
see from a process started from scratch.

    forks = start_fork_server([sys.executable, "tests/server_suite.py", "forks", socket_path])
    proc = ForkClient(socket_path).spawn(args, env=env, cwd=cwd, stdout=log, stderr=log)
    proc.terminate(); proc.wait(5)      # as with subprocess.Popen

`serve()` is the parent's loop; it returns only in a forked child, with the child's request,
so that the caller runs the server at the top of its own stack and the interpreter exits the
way it would after `python -m`.
"""

from __future__ import annotations

import array
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

_MAX_REQUEST = 4 << 20  # a request is its arguments and environment: far less than this
_FDS = 3  # stdin, stdout, stderr


@dataclass
class ForkRequest:
    """What one child runs: the server's arguments, in this environment and folder."""

    args: list[str]
    env: dict[str, str]
    cwd: str


def _send(sock: socket.socket, message: dict, fds: list[int] = ()) -> None:
    data = json.dumps(message).encode() + b"\n"
    if fds:
        sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    else:
        sock.sendall(data)


def _receive_request(conn: socket.socket) -> tuple[dict, list[int]]:
    """One request and the descriptors that came with it (on its first bytes)."""
    data, fds = b"", []
    while not data.endswith(b"\n"):
        chunk, ancillary, _, _ = conn.recvmsg(1 << 16, socket.CMSG_SPACE(_FDS * array.array("i").itemsize))
        if not chunk:
            raise ConnectionError("the client left before its request was whole")
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                got = array.array("i")
                got.frombytes(payload[: len(payload) - len(payload) % got.itemsize])
                fds += list(got)
        data += chunk
        if len(data) > _MAX_REQUEST:
            raise ConnectionError("request too large")
    return json.loads(data), fds


def _returncode(status: int) -> int:
    """A wait status as subprocess.Popen.returncode has it (-N: killed by signal N)."""
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def serve(path: str) -> ForkRequest | None:
    """Take requests on the Unix socket `path` until stdin closes (the parent left) or
    SIGTERM; each forks a child. Returns None in this process when done (its children
    killed), and the request in a child, whose standard streams, environment, folder and
    signal handlers are then the request's and the defaults."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    stopping = []
    old_wakeup = signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select through the pipe
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    children: dict[int, socket.socket] = {}
    print("ready", flush=True)  # the parent waits for this line
    while not stopping:
        readable, _, _ = select.select([listener, wake_r, sys.stdin], [], [])
        if wake_r in readable:
            while True:
                try:
                    if not os.read(wake_r, 512):
                        break
                except BlockingIOError:
                    break
        _reap(children)
        if sys.stdin in readable and not os.read(sys.stdin.fileno(), 512):
            break  # the parent is gone
        if listener in readable:
            conn, _ = listener.accept()
            try:
                message, fds = _receive_request(conn)
            except (ConnectionError, ValueError, OSError):
                conn.close()
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                for other in (listener, conn, *children.values()):
                    other.close()
                os.close(wake_r)
                os.close(wake_w)
                signal.set_wakeup_fd(old_wakeup)
                return _become(message, fds)
            for fd in fds:
                os.close(fd)
            children[pid] = conn
            try:
                _send(conn, {"pid": pid})
            except OSError:
                pass
    for pid in list(children):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while children and time.monotonic() < deadline:
        _reap(children)
        time.sleep(0.01)
    listener.close()
    return None


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            try:
                _send(conn, {"returncode": _returncode(status)})
            except OSError:
                pass
            conn.close()


def _become(message: dict, fds: list[int]) -> ForkRequest:
    """The child's side of a fork: the request's streams, environment and folder, default
    signal handlers, and its own random state (a fresh process would not share its parent's)."""
    for target, fd in enumerate(fds[:_FDS]):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    if message.get("session"):  # a group of its own, as Popen(start_new_session=True) gives
        os.setsid()
    for sig in (signal.SIGCHLD, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(message["cwd"])
    os.environ.clear()
    os.environ.update(message["env"])
    numpy = sys.modules.get("numpy")
    if numpy is not None:  # (Python's own `random` reseeds itself in a forked child)
        numpy.random.seed()
    return ForkRequest(args=list(message["args"]), env=dict(message["env"]), cwd=message["cwd"])


def start_fork_server(cmd: list[str], *, env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None,
                      timeout: float = 120) -> subprocess.Popen:
    """Start the parent process (`cmd` calls serve() on a socket path) and wait until it takes
    requests. It stops with its children when its stdin closes: stop_fork_server, or the end
    of this process."""
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=cwd)
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline() if ready else ""
    if line.strip() != "ready":
        proc.kill()
        proc.wait()
        raise RuntimeError(f"the fork server did not start (exit {proc.returncode}): {line!r}")
    return proc


def stop_fork_server(proc: subprocess.Popen) -> None:
    proc.stdin.close()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _fd_of(stream, default: int) -> int:
    if stream is None:
        return default
    if stream == subprocess.DEVNULL:
        return os.open(os.devnull, os.O_RDWR)
    return stream if isinstance(stream, int) else stream.fileno()


class ForkedProcess:
    """A forked server as subprocess.Popen shows a child: pid, poll, wait, terminate, kill.
    Its exit status comes from the fork server, which reaps it."""

    def __init__(self, conn: socket.socket, pid: int, args: list[str]) -> None:
        self._conn = conn
        self._buffer = b""
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def _read(self, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                message = json.loads(line)
                if "returncode" in message:
                    self.returncode = message["returncode"]
                    self._conn.close()
                    return
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self._conn], [], [], left)
            if not ready:
                return
            chunk = self._conn.recv(4096)
            if not chunk:  # the fork server went away without saying: treat as killed
                self.returncode = -signal.SIGKILL
                self._conn.close()
                return
            self._buffer += chunk

    def poll(self) -> int | None:
        self._read(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._read(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # never signal a pid the fork server has reaped already
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkClient:
    """Asks the fork server at `path` for children."""

    def __init__(self, path: str) -> None:
        self.path = path

    def spawn(self, args: list[str], *, env: dict[str, str] | None = None, cwd: str | None = None,
              stdin=None, stdout=None, stderr=None, session: bool = False) -> ForkedProcess:
        """A child running the server with `args` (stdin/stdout/stderr as subprocess.Popen
        takes them: None inherits this process's, a file, a descriptor or DEVNULL; `session`:
        in a session and process group of its own)."""
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.path)
        fds = [_fd_of(stdin, 0), _fd_of(stdout, 1)]
        fds.append(fds[1] if stderr == subprocess.STDOUT else _fd_of(stderr, 2))
        message = {"args": [str(a) for a in args], "env": dict(os.environ if env is None else env),
                   "cwd": str(cwd or os.getcwd()), "session": session}
        _send(conn, message, fds)
        for stream, fd in zip((stdin, stdout, stderr), fds):
            if stream == subprocess.DEVNULL:
                os.close(fd)
        line = b""
        while not line.endswith(b"\n"):
            chunk = conn.recv(4096)
            if not chunk:
                conn.close()
                raise RuntimeError("the fork server closed the connection before forking")
            line += chunk
        first, rest = line.split(b"\n", 1)
        proc = ForkedProcess(conn, json.loads(first)["pid"], list(args))
        proc._buffer = rest
        return proc
