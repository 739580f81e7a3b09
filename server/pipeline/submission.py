"""The asyncio side of a request submitted to the engine: its choices, their events, the client.

A request is one engine request per choice (`n` > 1 and batches of prompts give several;
`n=1` is the one-choice case). Every request's sink tags its events with the choice index
and puts them on one asyncio queue (one `call_soon_threadsafe` per push from the engine
thread), so a response reads all of its choices in the order the engine produced them. A
client that leaves, or an error in any choice, aborts all of them.
"""

from __future__ import annotations

import asyncio
import collections
from typing import AsyncIterator

from warmslot.slots import Engine, EngineError, ErrorKind, Event, GenerateRequest, NotReady, QueueFull, Rejected, ShuttingDown

from ..errors import ApiError, ClientClosed, ContextOverflow, InvalidRequest, RequestTimeout, ServerError, Unavailable, shutting_down


def engine_error(
    error: EngineError, n_prompt: int, n_ctx: int, prompt_param: str = "messages", time_limit: float | None = None
) -> ApiError:
    """The API error for an engine error; `prompt_param` names the prompt's field, and
    `time_limit` is the request's own limit in seconds (the engine sees only its deadline,
    which started counting when the request arrived, before its prompt was built)."""
    if error.kind is ErrorKind.INVALID:
        return InvalidRequest(error.message)
    if error.kind is ErrorKind.CONTEXT:
        return ContextOverflow(n_prompt, n_ctx, param=prompt_param)
    if error.kind is ErrorKind.BUSY:
        return Unavailable(error.message, retry_after=2, code="kv_cache_full")
    if error.kind is ErrorKind.TIMEOUT:
        if time_limit is not None:
            return RequestTimeout(f"the request did not finish within its timeout of {time_limit:g} s")
        return RequestTimeout(error.message)
    if error.kind is ErrorKind.SHUTDOWN:
        return shutting_down(error.message)
    if error.kind is ErrorKind.MODEL_OUTPUT:
        return ServerError(error.message, code="invalid_logits")
    return ServerError(error.message)


class TaggedSink:
    """A request's sink that puts (choice index, events) on a shared queue.

    `quiet`: the reply is sent whole (not streamed), so text and tokens are held on the engine
    thread and handed over with the next event that the reader waits for (the start, the
    finish, an error): the event loop is not woken for every token. On a CPU its wake-ups
    took about 0.4 ms of a core per token, a core that llama.cpp's threads decode on."""

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, index: int, *, quiet: bool = False) -> None:
        self._loop = loop
        self._queue = queue
        self.index = index
        self.quiet = quiet
        self._held: list[Event] = []  # engine thread only

    def push(self, events: list[Event]) -> None:  # engine thread
        if self.quiet and not any(_awaited(ev) for ev in events):
            self._held += events
            return
        if self._held:
            events, self._held = self._held + events, []
        self._loop.call_soon_threadsafe(self._queue.put_nowait, (self.index, events))


def _awaited(ev: Event) -> bool:
    """An event that a reader of the whole reply acts on when it comes."""
    return ev.started or ev.finish is not None or ev.error is not None or ev.progress is not None


async def _watch_disconnect(receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


def _submit_one(engine: Engine, req: GenerateRequest, n_ctx: int, prompt_param: str, time_limit: float | None) -> None:
    try:
        engine.submit(req)
    except ShuttingDown as exc:
        raise shutting_down() from exc
    except QueueFull as exc:
        raise Unavailable(f"the server is busy: {exc}; retry later", retry_after=1, code="queue_full") from exc
    except NotReady as exc:
        raise Unavailable(str(exc), retry_after=5, code="loading") from exc
    except Rejected as exc:
        raise engine_error(exc.error, len(req.tokens), n_ctx, prompt_param, time_limit) from None


class Submission:
    """The choices of one request in the engine, seen from the event loop."""

    def __init__(
        self, engine: Engine, reqs: list[GenerateRequest], queue: asyncio.Queue, n_ctx: int, prompt_param: str, time_limit: float | None
    ) -> None:
        self.engine = engine
        self.reqs = reqs
        self.queue = queue
        self.n_ctx = n_ctx
        self.prompt_param = prompt_param
        self.time_limit = time_limit
        self._running = set(range(len(reqs)))
        self._buffer: collections.deque[tuple[int, Event]] = collections.deque()
        self._watcher: asyncio.Future | None = None

    @property
    def req(self) -> GenerateRequest:
        """The first choice's request (names the response)."""
        return self.reqs[0]

    @classmethod
    def submit(
        cls, engine: Engine, reqs: list[GenerateRequest], queue: asyncio.Queue, n_ctx: int, prompt_param: str = "messages",
        time_limit: float | None = None,
    ) -> "Submission":
        """Queue every choice; if one is refused, the ones already queued are aborted."""
        for i, req in enumerate(reqs):
            try:
                _submit_one(engine, req, n_ctx, prompt_param, time_limit)
            except BaseException:
                for queued in reqs[:i]:
                    engine.abort(queued.id)
                raise
        return cls(engine, reqs, queue, n_ctx, prompt_param, time_limit)

    def abort(self) -> None:
        """End every choice still running (a no-op once all finished)."""
        self.stop_watching()
        for i in self._running:
            self.engine.abort(self.reqs[i].id)
        self._running.clear()

    def stop_watching(self) -> None:
        """Stop reading the ASGI channel (a streaming response listens for disconnects itself)."""
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None

    async def started(self, receive) -> Event:
        """Wait until the first choice is admitted (the others follow it); its 'started'
        event. An engine error in any choice raises its ApiError; a client that leaves
        aborts the request and raises ClientClosed."""
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
            raise engine_error(ev.error, len(self.reqs[index].tokens), self.n_ctx, self.prompt_param, self.time_limit)

    async def _next(self, receive) -> tuple[int, list[Event]]:
        if receive is None:
            return await self.queue.get()
        if self._watcher is None:
            self._watcher = asyncio.ensure_future(_watch_disconnect(receive))
        getter = asyncio.ensure_future(self.queue.get())
        done, _ = await asyncio.wait({getter, self._watcher}, return_when=asyncio.FIRST_COMPLETED)
        if getter in done:
            return getter.result()
        getter.cancel()
        self.abort()
        raise ClientClosed("the client left while its request ran")
