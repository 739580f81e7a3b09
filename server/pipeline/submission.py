"""Several engine requests answered as one response's choices (n > 1, batches of prompts).

Every request's sink tags its events with the choice index and puts them on one asyncio
queue, so a response reads all of its choices in the order the engine produced them. A
client that leaves, or an error in any choice, aborts all of them.
"""

from __future__ import annotations

import asyncio
import collections
from typing import AsyncIterator

from warmslot.slots import Engine, Event, GenerateRequest

from .bridge import DisconnectWatch, Submission, engine_error


class TaggedSink:
    """A request's sink that puts (choice index, events) on a shared queue."""

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, index: int) -> None:
        self._loop = loop
        self._queue = queue
        self.index = index

    def push(self, events: list[Event]) -> None:  # engine thread
        self._loop.call_soon_threadsafe(self._queue.put_nowait, (self.index, events))


class Fanout(DisconnectWatch):
    """The choices of one response, seen from the event loop."""

    def __init__(self, engine: Engine, reqs: list[GenerateRequest], queue: asyncio.Queue, n_ctx: int) -> None:
        self.engine = engine
        self.reqs = reqs
        self.queue = queue
        self.n_ctx = n_ctx
        self._running = set(range(len(reqs)))
        self._buffer: collections.deque[tuple[int, Event]] = collections.deque()
        self._watcher: asyncio.Future | None = None

    @property
    def req(self) -> GenerateRequest:
        """The first choice's request (names the response)."""
        return self.reqs[0]

    @classmethod
    def submit(cls, engine: Engine, reqs: list[GenerateRequest], queue: asyncio.Queue, n_ctx: int) -> "Fanout":
        """Queue every choice; if one is refused, the ones already queued are aborted."""
        for i, req in enumerate(reqs):
            try:
                Submission.submit(engine, req, req.sink, n_ctx)
            except BaseException:
                for queued in reqs[:i]:
                    engine.abort(queued.id)
                raise
        return cls(engine, reqs, queue, n_ctx)

    def abort(self) -> None:
        self.stop_watching()
        for i in self._running:
            self.engine.abort(self.reqs[i].id)
        self._running.clear()

    async def started(self, receive) -> Event:
        """Wait until the first choice is admitted (the others follow it); its 'started'
        event. An engine error in any choice raises its ApiError."""
        while True:
            index, events = await self._next(receive)
            for ev in events:
                self._check(index, ev)
            self._buffer.extend((index, ev) for ev in events)
            for ev in events:
                if index == 0 and ev.started:
                    return ev

    async def events(self, receive=None) -> AsyncIterator[tuple[int, Event]]:
        """(choice index, event) until every choice has finished."""
        try:
            while self._running:
                if not self._buffer:
                    index, events = await self._next(receive)
                    self._buffer.extend((index, ev) for ev in events)
                    continue
                index, ev = self._buffer.popleft()
                self._check(index, ev)
                yield index, ev
                if ev.finish is not None:
                    self._running.discard(index)
        finally:
            self.abort()  # no-op once all finished; a cancelled stream ends the rest here

    def _check(self, index: int, ev: Event) -> None:
        if ev.error is not None:
            self._running.discard(index)
            self.abort()
            raise engine_error(ev.error, len(self.reqs[index].tokens), self.n_ctx)

    async def _next(self, receive) -> tuple[int, list[Event]]:
        return await self._next_or_gone(self.queue.get, receive)
