"""A request's life beyond its tokens: deadlines, and draining the engine for a shutdown.

`Lifecycle` is a part of the `Engine` (a mixin): the engine calls `_expire_deadlines` once
per step; the HTTP side calls `drain` and `end_running` (any thread), which only set a flag
and put a message into the inbox, like `abort`.

- A request whose `deadline` (time.monotonic()) passes ends with a TIMEOUT error, whether it
  waits for a slot or runs; its slot is free for the next request in the same step.
- `drain()` refuses every later submission (`ShuttingDown`) and fails the waiting requests
  at once with a SHUTDOWN error; running requests go on. `end_running()` ends them with a
  SHUTDOWN error (the server calls it when its shutdown timeout has passed).
"""

from __future__ import annotations

import collections
import concurrent.futures
import time

from .requests import EngineError, ErrorKind, FinishReason, GenerateRequest, NotReady


class ShuttingDown(NotReady):
    """The engine is draining for a shutdown and takes no new requests."""


class Lifecycle:
    """Deadlines and draining; mixed into `Engine`, whose thread runs the underscore methods."""

    _draining = False

    # -- any thread ----------------------------------------------------------------------

    def drain(self) -> concurrent.futures.Future:
        """Take no new requests and fail the waiting ones; running requests go on."""
        with self._cv:
            self._draining = True
        return self.call(lambda engine: engine._fail_waiting(lambda req: _shutdown_error()))

    def end_running(self) -> concurrent.futures.Future:
        """End every running (and waiting) request with a SHUTDOWN error."""
        def end(engine) -> None:
            engine._fail_waiting(lambda req: _shutdown_error())
            for slot in engine.slots:
                if slot.active is not None:
                    engine._finish(slot, FinishReason.STOP, _shutdown_error())
            engine._flush()

        return self.call(end)

    @property
    def draining(self) -> bool:
        return self._draining

    def n_unfinished(self) -> int:
        """Requests submitted and not finished (from the view published after the last step)."""
        snap = self.snapshot()
        running = sum(1 for s in snap.slots if s.state != "idle") if snap is not None else 0
        return running + self.queue_depth

    # -- the engine thread ---------------------------------------------------------------

    def _expire_deadlines(self) -> None:
        now = time.monotonic()
        for slot in self.slots:
            active = slot.active
            if active is not None and active.req.deadline is not None and now >= active.req.deadline:
                self._finish(slot, FinishReason.STOP, _timeout_error(active.req))
        if any(req.deadline is not None and now >= req.deadline for req in self._waiting):
            self._fail_waiting(lambda req: _timeout_error(req) if req.deadline is not None and now >= req.deadline else None)

    def _fail_waiting(self, error_for) -> None:
        """Fail every waiting request for which `error_for(req)` gives an error."""
        kept: collections.deque[GenerateRequest] = collections.deque()
        for req in self._waiting:
            error = error_for(req)
            if error is None:
                kept.append(req)
                continue
            self._dequeued()
            self._reject(req, error)
        self._waiting = kept


def _timeout_error(req: GenerateRequest) -> EngineError:
    seconds = req.deadline - req.submitted
    return EngineError(ErrorKind.TIMEOUT, f"the request did not finish within its timeout of {seconds:.3g} s")


def _shutdown_error() -> EngineError:
    return EngineError(ErrorKind.SHUTDOWN, "the server is shutting down; retry on another instance or later")

