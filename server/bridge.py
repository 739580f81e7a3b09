"""The asyncio side of a request submitted to the engine.

The engine thread pushes lists of events; `AsyncSink` moves them onto the event loop with
one `call_soon_threadsafe` per push. `Submission` waits for them, watches for the client
going away, and aborts the request in the engine when it does.
"""

from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator

from warmslot.slots import Engine, EngineError, ErrorKind, Event, GenerateRequest, NotReady, QueueFull, Rejected, ShuttingDown

from .errors import ApiError, ContextOverflow, InvalidRequest, RequestTimeout, ServerError, Unavailable

log = logging.getLogger("warmslot.server")


class AsyncSink:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[list[Event]] = asyncio.Queue()

    def push(self, events: list[Event]) -> None:  # engine thread
        self._loop.call_soon_threadsafe(self._queue.put_nowait, events)

    async def get(self) -> list[Event]:
        return await self._queue.get()


class ClientGone(Exception):
    """The client disconnected while its request was running."""


def engine_error(error: EngineError, n_prompt: int, n_ctx: int) -> ApiError:
    if error.kind is ErrorKind.INVALID:
        return InvalidRequest(error.message)
    if error.kind is ErrorKind.CONTEXT:
        return ContextOverflow(n_prompt, n_ctx)
    if error.kind is ErrorKind.BUSY:
        return Unavailable(error.message, retry_after=2, code="kv_cache_full")
    if error.kind is ErrorKind.TIMEOUT:
        return RequestTimeout(error.message)
    if error.kind is ErrorKind.SHUTDOWN:
        return shutting_down(error.message)
    return ServerError(error.message)


def shutting_down(message: str = "the server is shutting down; retry on another instance or later") -> Unavailable:
    return Unavailable(message, retry_after=1, code="shutting_down")


async def _watch_disconnect(receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class DisconnectWatch:
    """Waits for a queue's next item while watching the client: once the client disconnects,
    `abort()` ends the request(s) in the engine and ClientGone is raised."""

    _watcher: asyncio.Future | None = None

    def abort(self) -> None:
        raise NotImplementedError

    def stop_watching(self) -> None:
        """Stop reading the ASGI channel (a streaming response listens for disconnects itself)."""
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None

    async def _next_or_gone(self, get, receive):
        if receive is None:
            return await get()
        if self._watcher is None:
            self._watcher = asyncio.ensure_future(_watch_disconnect(receive))
        getter = asyncio.ensure_future(get())
        done, _ = await asyncio.wait({getter, self._watcher}, return_when=asyncio.FIRST_COMPLETED)
        if getter in done:
            return getter.result()
        getter.cancel()
        self.abort()
        raise ClientGone()


class Submission(DisconnectWatch):
    """One request in the engine, seen from the event loop."""

    def __init__(self, engine: Engine, req: GenerateRequest, sink: AsyncSink, n_ctx: int) -> None:
        self.engine = engine
        self.req = req
        self.sink = sink
        self.n_ctx = n_ctx
        self.done = False
        self._buffer: list[Event] = []
        self._watcher: asyncio.Future | None = None

    @classmethod
    def submit(cls, engine: Engine, req: GenerateRequest, sink: AsyncSink, n_ctx: int) -> "Submission":
        try:
            engine.submit(req)
        except ShuttingDown as exc:
            raise shutting_down() from exc
        except QueueFull as exc:
            raise Unavailable(f"the server is busy: {exc}; retry later", retry_after=1, code="queue_full") from exc
        except NotReady as exc:
            raise Unavailable(str(exc), retry_after=5, code="loading") from exc
        except Rejected as exc:
            raise engine_error(exc.error, len(req.tokens), n_ctx) from None
        return cls(engine, req, sink, n_ctx)

    def abort(self) -> None:
        self.stop_watching()
        if not self.done:
            self.done = True
            self.engine.abort(self.req.id)

    async def started(self, receive) -> Event:
        """Wait until the engine admits the request (or fails it); abort if the client leaves.

        Returns the 'started' event; raises the ApiError for an engine error."""
        while True:
            events = await self._next(receive)
            for i, ev in enumerate(events):
                if ev.error is not None:
                    self.done = True
                    raise engine_error(ev.error, len(self.req.tokens), self.n_ctx)
                if ev.started:
                    self._buffer = events[i:]
                    return ev

    async def events(self, receive=None) -> AsyncIterator[Event]:
        """All events after admission, ending with the finish; an engine error raises."""
        try:
            while True:
                events = self._buffer or await self._next(receive)
                self._buffer = []
                for ev in events:
                    if ev.error is not None:
                        self.done = True
                        raise engine_error(ev.error, len(self.req.tokens), self.n_ctx)
                    yield ev
                    if ev.finish is not None:
                        self.done = True
                        return
        finally:
            self.abort()  # no-op once finished; a cancelled stream ends the request here

    async def _next(self, receive) -> list[Event]:
        return await self._next_or_gone(self.sink.get, receive)
