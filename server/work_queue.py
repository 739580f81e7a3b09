"""Work sent to a thread pool, seen from the event loop: counted, cancellable and bounded.

A request that waits for the tokenize pool or the embeddings worker waits in a queue as
much as one that waits for a slot, so it counts against --max-queue (503 `queue_full` with
Retry-After past it). While it waits, its client may leave or its deadline pass: work that
has not started yet is dropped, work that runs is told to stop (`Job.cancelled`, for the
work that can look) and its result is ignored either way.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from typing import Any, Callable

from starlette.requests import Request

from .errors import ClientClosed, RequestTimeout, Unavailable


class Job:
    """One piece of work, shared by the event loop and the thread that runs it."""

    __slots__ = ("_queue", "_started", "_cancel")

    def __init__(self, queue: "WorkQueue") -> None:
        self._queue = queue
        self._started = False
        self._cancel = threading.Event()

    def start(self) -> bool:
        """The worker begins (any thread). False: the job was cancelled; do nothing."""
        with self._queue._lock:
            if self._started:
                return not self._cancel.is_set()
            self._started = True
            self._queue.waiting -= 1
        return not self._cancel.is_set()

    def cancelled(self) -> bool:
        """Whether the waiter gave up (the worker may stop and return anything)."""
        return self._cancel.is_set()

    def _give_up(self) -> None:
        self._cancel.set()
        with self._queue._lock:
            if not self._started:  # never started: it no longer waits
                self._started = True
                self._queue.waiting -= 1

    def call(self, fn: Callable, *args) -> Any:
        """`fn(*args)` unless cancelled before it started (a pool's task)."""
        if not self.start():
            return None
        return fn(*args)


class WorkQueue:
    """Jobs waiting for one pool. `limit()` is the most that may wait (--max-queue)."""

    def __init__(self, name: str, limit: Callable[[], int]) -> None:
        self.name = name
        self.limit = limit
        self.waiting = 0  # jobs submitted and not started (nor given up)
        self._lock = threading.Lock()
        self._closed = False
        self._waiters: set[asyncio.Future] = set()  # one per run() in progress (event loop)

    def close(self) -> None:
        """The server shuts down (event loop): every job is given up, its waiter answers 503
        `shutting_down`, and no new job is taken."""
        self._closed = True
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _admit(self) -> Job:
        if self._closed:
            raise _shutting_down()
        with self._lock:
            if self.waiting >= self.limit():
                raise Unavailable(
                    f"the server is busy: {self.waiting} requests wait for the {self.name}; retry later",
                    retry_after=1, code="queue_full",
                )
            self.waiting += 1
        return Job(self)

    async def run(
        self, submit: Callable[[Job], concurrent.futures.Future], *, request: Request | None = None, deadline: float | None = None
    ) -> Any:
        """The result of `submit(job)`'s future. Raises 503 when the queue is full, 408 past
        `deadline` (time.monotonic()), ClientClosed (499) when the client disconnects."""
        job = self._admit()
        try:
            future = submit(job)
        except BaseException:
            job._give_up()
            raise
        waiter = asyncio.wrap_future(future)
        watcher = asyncio.ensure_future(_disconnected(request.receive)) if request is not None else None
        closing = asyncio.get_running_loop().create_future()
        self._waiters.add(closing)
        try:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            watched = {waiter, closing, *([watcher] if watcher else [])}
            done, _ = await asyncio.wait(watched, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if waiter in done:
                return waiter.result()
            if closing in done:
                raise _shutting_down()
            if watcher is not None and watcher in done:
                raise ClientClosed(f"the client left while its request waited for the {self.name}")
            raise RequestTimeout(f"the request passed its deadline while it waited for the {self.name}")
        finally:
            self._waiters.discard(closing)
            if watcher is not None:
                watcher.cancel()
            if not waiter.done():
                job._give_up()
                future.cancel()  # dropped if it had not started
                waiter.cancel()
            elif waiter.cancelled():
                job._give_up()


def _shutting_down() -> Unavailable:
    return Unavailable("the server is shutting down; retry on another instance or later", retry_after=1, code="shutting_down")


async def _disconnected(receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
