"""Graceful shutdown: SIGTERM (or a first Ctrl-C) drains the server before it exits.

1. New requests get 503 (`shutting_down`) and /health answers 503, so a load balancer or
   Kubernetes takes the instance out of rotation while it still answers.
2. Requests waiting for a slot fail at once with 503; running requests go on.
3. When they have all finished, or --shutdown-timeout has passed, the rest end with an
   OpenAI-shaped error (a stream gets an error event and [DONE]).
4. uvicorn then stops listening, lets the last responses go out and exits with status 0.
5. Prompt building and embeddings that wait or run end at step 1 with 503; whatever still
   keeps the process alive --shutdown-timeout plus 5 s after the signal is not waited for.

A second signal exits at once, as uvicorn does.

NOTE: sse-starlette ends every stream as soon as uvicorn is told to exit, without [DONE].
Its automatic drain is turned off here: uvicorn hears of the exit only after the engine has
ended every request, so each stream has written its last event by then.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time

import uvicorn
from sse_starlette.sse import AppStatus

from ..state import Server

log = logging.getLogger("warmslot.server")

POLL_S = 0.05
EXIT_GRACE_S = 5.0  # past --shutdown-timeout: the process exits, whatever still runs


def _exit_now() -> None:
    """The drain, uvicorn or a worker thread did not let the process end in time.

    NOTE: Python joins every thread pool's workers at exit, so one stuck in llama.cpp (a
    tokenization, an embedding) would keep a drained process alive: it is not waited for."""
    log.warning("shutting down: still running %.0f s past --shutdown-timeout; exiting now", EXIT_GRACE_S)
    logging.shutdown()
    os._exit(0)


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, server: Server, timeout: float) -> None:
        super().__init__(config)
        self.warmslot = server
        self.drain_timeout = timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task | None = None
        AppStatus.disable_automatic_graceful_drain()

    async def serve(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame) -> None:
        """A signal handler (main thread). The first signal starts the drain; the next one
        exits now. NOTE: the signal is not recorded for uvicorn to raise again after it
        stops, so the process exits with 0 after a drain."""
        if self._loop is None or self.should_exit or self._drain_task is not None:
            self.should_exit = True
            self.force_exit = self.force_exit or sig == signal.SIGINT or self._drain_task is not None
            AppStatus.should_exit = True
            return
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        if self._drain_task is None:
            self._drain_task = self._loop.create_task(self.drain())
            watchdog = threading.Timer(self.drain_timeout + EXIT_GRACE_S, _exit_now)
            watchdog.daemon = True
            watchdog.start()

    async def drain(self) -> None:
        server = self.warmslot
        server.draining = True
        server.close_queues()  # prompt building and embeddings that wait or run end now
        several = server.models is not None
        engines = [each.engine for each in server.models.hosts() if each.ready] if several else [server.default.engine]
        if not several and not server.default.ready:
            self.should_exit = True
            return
        unfinished = lambda: sum(engine.n_unfinished() for engine in engines)  # noqa: E731
        log.info("shutting down: %d requests to finish within %.0f s", unfinished(), self.drain_timeout)
        for engine in engines:
            await asyncio.wrap_future(engine.drain())
        deadline = time.monotonic() + self.drain_timeout
        while unfinished() and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
        left = unfinished()
        if left:
            log.warning("shutting down: ending %d requests that did not finish in time", left)
            for engine in engines:
                await asyncio.wrap_future(engine.end_running())
        self.should_exit = True
