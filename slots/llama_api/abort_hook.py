"""A last word before llama.cpp ends the process.

llama.cpp ends the process on a failed `GGML_ASSERT` (`ggml_abort`) and on a C++ exception
that leaves its C API (`std::terminate`, after ggml's handler prints the exception and a
backtrace): both print to stderr, then call abort(), and no Python code runs after that.
`on_abort(report)` installs a SIGABRT handler, with libc's `signal` through ctypes, that
writes the lines `report()` returns and every Python thread's stack to stderr, then lets
the process end as it would have (killed by SIGABRT, the same core dump policy).
`faulthandler` covers the other fatal signals (SIGSEGV, SIGBUS, SIGFPE, SIGILL) with the
Python stacks alone.

The handler runs Python on the thread that aborts. That thread is inside a ctypes call
(which released the GIL) or one of ggml's own threads, so the interpreter is in a consistent
state; ctypes takes the GIL for the handler. `report()` must only read (no locks, no
logging): another thread may hold the logging lock where it stopped. If the handler itself
hangs, a watchdog (`faulthandler.dump_traceback_later`) ends the process after
`WATCHDOG_S`.

A SIGABRT sent by another process (`kill -ABRT`) is another matter: the kernel hands it to
any thread that does not block it, often one that holds the GIL in the middle of Python
code, and a handler run there can wait forever on what the interrupted code holds.
`hold_sent_aborts()`, called before the process starts its threads, blocks SIGABRT in the
calling thread (threads started later inherit the mask) and starts one thread that waits
for it with `sigwait`: a sent SIGABRT is reported from there, in plain Python, and then the
process aborts. An abort() inside llama.cpp is not affected: abort() unblocks SIGABRT in
the aborting thread and raises it there.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import sys
import threading
from typing import Callable

PREFIX = "warmslot crash:"  # every line the handler writes starts with it
WATCHDOG_S = 10.0

_HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_int)
_installed: list = []  # the ctypes callback, kept alive while the handler is installed
_report: list[Callable[[], list[str]]] = []  # what `on_abort` was last given
_libc = ctypes.CDLL(None, use_errno=True)
_install = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_int, _HANDLER)(("signal", _libc))
_reset = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)(("signal", _libc))  # None: SIG_DFL
_raise = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)(("raise", _libc))


def _write_report(fd: int) -> None:
    """The report's lines and every Python thread's stack, on `fd`; never raises."""
    try:
        try:
            lines = _report[0]() if _report else []
        except BaseException as exc:  # noqa: BLE001 - a dying process still says what it can
            lines = [f"(the running requests could not be listed: {type(exc).__name__}: {exc})"]
        text = "".join(f"{PREFIX} {line}\n" for line in lines)
        os.write(fd, text.encode("utf-8", "replace"))
        os.write(fd, f"{PREFIX} the Python threads' stacks follow\n".encode())
        faulthandler.dump_traceback(file=fd, all_threads=True)
    except BaseException:  # noqa: BLE001 - nothing may stop the process from ending
        pass


def _die() -> None:
    """End the process by SIGABRT with the default action (no handler runs again)."""
    _reset(signal.SIGABRT, None)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGABRT})
    _raise(signal.SIGABRT)


def on_abort(report: Callable[[], list[str]]) -> None:
    """Write `report()`'s lines (each after `PREFIX`) and the Python stacks to stderr when the
    process aborts. Process-wide; installing again replaces the report."""
    fd = sys.stderr.fileno()
    faulthandler.enable(file=sys.stderr, all_threads=True)  # SIGSEGV and the rest (SIGABRT is ours below)
    _report[:] = [report]

    def handler(signum: int) -> None:
        try:
            faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)
        except BaseException:  # noqa: BLE001
            pass
        _write_report(fd)
        # NOTE: abort() would reset the handler and raise again once this returns, but a
        # SIGABRT sent by kill would not: raised here, with the default action back, it is
        # pending until the handler returns and then ends the process either way
        _reset(signal.SIGABRT, None)
        _raise(signal.SIGABRT)

    callback = _HANDLER(handler)
    _install(signal.SIGABRT, callback)
    _installed[:] = [callback]


_holding: list[threading.Thread] = []


def hold_sent_aborts() -> None:
    """Take SIGABRTs sent by other processes on a thread of their own (see the module's
    docstring). Call it on the main thread before any other thread starts; idempotent."""
    if _holding:
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGABRT})
    fd = sys.stderr.fileno()

    def wait() -> None:
        signal.sigwait({signal.SIGABRT})
        faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)
        _write_report(fd)
        _die()

    thread = threading.Thread(target=wait, name="warmslot-sigabrt", daemon=True)
    _holding.append(thread)
    thread.start()
