"""--sleep-idle-seconds: the model is unloaded after that long without a request, and loaded
again, as it was, by the next request that needs it.

Asleep, the model's weights and its contexts are freed; the prompt cache (the idle slots'
contents moved there first) and the disk tier stay, so a conversation that comes back after
the wake is served from RAM as before. Reads do not wake the model: GET, HEAD and OPTIONS
requests (/health, /props with `is_sleeping`, /v1/models, /metrics, /slots, /engine, the
page) are answered from what the server keeps. Any other request (a generation, /tokenize,
token counting, slot files) waits for the wake, then runs as usual; the engine is never put to
sleep while such a request is in flight or a generation runs or waits.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable

from ..errors import Unavailable
from ..middleware.guard import send_error

log = logging.getLogger("warmslot.server")

READS = frozenset({"GET", "HEAD", "OPTIONS"})


class Sleeper:
    """`ready()`: the server serves (its model loaded once); `rebuild()`: after a wake, make
    what the server built on the model's vocabulary again (the prompt builder)."""

    def __init__(self, engine: Any, idle_s: float, *, ready: Callable[[], bool], rebuild: Callable[[], None]) -> None:
        self.engine = engine
        self.ready = ready
        self.rebuild = rebuild
        self.idle_s = idle_s
        self.asleep = False
        self.in_flight = 0  # requests that needed the model and have not finished
        self.last_active = time.monotonic()
        self._lock = asyncio.Lock()  # one transition at a time

    async def watch(self) -> None:
        """Put the engine to sleep once it has been idle for `idle_s` (a background task)."""
        engine = self.engine
        while True:
            await asyncio.sleep(min(0.25, self.idle_s / 4))
            if self.asleep or self.in_flight or not self.ready():
                continue
            if engine.n_unfinished() or engine.queue_depth:
                self.last_active = time.monotonic()
                continue
            if time.monotonic() - self.last_active >= self.idle_s:
                await self._sleep()

    async def _sleep(self) -> None:
        async with self._lock:
            if self.asleep or self.in_flight:
                return
            if await asyncio.wrap_future(self.engine.sleep()):
                self.asleep = True
            else:  # busy after all: try again after another idle period
                self.last_active = time.monotonic()

    async def wake(self) -> None:
        """Load the model again if it sleeps (requests that need it wait here together). A
        request that comes while the engine is being put to sleep waits for that, then wakes it."""
        if not self.asleep and not self._lock.locked():
            return
        async with self._lock:
            if not self.asleep:
                return
            await asyncio.wrap_future(self.engine.wake())
            # the prompt builder holds the vocabulary of the model that was freed
            await asyncio.get_running_loop().run_in_executor(None, self.rebuild)
            self.asleep = False


class WakeOnRequest:
    """ASGI middleware: a request that is not a read wakes the model first, and counts as
    activity until its response is sent."""

    def __init__(self, app, sleeper: Sleeper | None) -> None:
        self.app = app
        self.sleeper = sleeper

    async def __call__(self, scope, receive, send):
        sleeper = self.sleeper
        if sleeper is None or scope["type"] != "http" or scope["method"] in READS:
            return await self.app(scope, receive, send)
        sleeper.in_flight += 1
        try:
            try:
                await sleeper.wake()
            except Exception as exc:  # noqa: BLE001 - the request gets an error, the server stays up
                log.error("waking the model failed: %s", exc)
                error = Unavailable(f"the model could not be loaded again: {exc}", retry_after=5, code="wake_failed")
                await send_error(send, error, scope["path"])
                return
            await self.app(scope, receive, send)
        finally:
            sleeper.in_flight -= 1
            sleeper.last_active = time.monotonic()
