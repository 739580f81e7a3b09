"""A request's life beyond its tokens: deadlines, and draining the engine for a shutdown.

`Lifecycle` works on the engine through a declared contract, `Running` (what it may do to
running requests), and on the queue through `Admission`. The engine calls `expire_deadlines`
once per step on its thread; the HTTP side calls `drain` and `end_running` (any thread),
which only set a flag and put a message into the inbox, like `abort`.

- A request whose `deadline` (time.monotonic()) passes ends with a TIMEOUT error, whether it
  waits for a slot or runs; its slot is free for the next request in the same step.
- `drain()` refuses every later submission (`ShuttingDown`) and fails the waiting requests
  at once with a SHUTDOWN error; running requests go on. `end_running()` ends them with a
  SHUTDOWN error (the server calls it when its shutdown timeout has passed).
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any, Callable, Iterator, Protocol

from .admission import Admission
from ..requests import EngineError, ErrorKind, GenerateRequest
from ..slot import Slot

__all__ = ["Lifecycle", "Running"]


class Running(Protocol):
    """What the lifecycle may do to the engine's running requests (the engine provides it)."""

    def call(self, fn: Callable[[Any], Any]) -> concurrent.futures.Future:
        """Any thread: run fn(engine) on the engine thread between steps."""

    def running(self) -> Iterator[Slot]:
        """Engine thread: the slots that serve a request."""

    def end(self, slot: Slot, error: EngineError) -> None:
        """Engine thread: end the slot's request with `error`; the slot is free at once, the
        request hears of it at the next `deliver` (or the end of the step)."""

    def deliver(self) -> None:
        """Engine thread: hand every pending event to its request now."""

    def n_running(self) -> int:
        """Any thread: requests holding a slot, as of the last step."""


class Lifecycle:
    def __init__(self, engine: Running, admission: Admission) -> None:
        self._engine = engine
        self._admission = admission

    # -- any thread ------------------------------------------------------------------------

    def drain(self) -> concurrent.futures.Future:
        """Take no new requests and fail the waiting ones; running requests go on."""
        self._admission.close()
        return self._engine.call(lambda engine: self._admission.fail_waiting(lambda req: _shutdown_error()))

    def end_running(self) -> concurrent.futures.Future:
        """End every running (and waiting) request with a SHUTDOWN error."""
        def end(engine) -> None:
            self._admission.fail_waiting(lambda req: _shutdown_error())
            for slot in list(self._engine.running()):
                self._engine.end(slot, _shutdown_error())
            self._engine.deliver()

        return self._engine.call(end)

    @property
    def draining(self) -> bool:
        return self._admission.draining

    def n_unfinished(self) -> int:
        """Requests submitted and not finished (from the view published after the last step)."""
        return self._engine.n_running() + self._admission.n_queued

    # -- the engine thread -----------------------------------------------------------------

    def expire_deadlines(self) -> None:
        now = time.monotonic()
        for slot in list(self._engine.running()):
            req = slot.active.req
            if req.deadline is not None and now >= req.deadline:
                self._engine.end(slot, _timeout_error(req))
        if any(req.deadline is not None and now >= req.deadline for req in self._admission.waiting):
            self._admission.fail_waiting(
                lambda req: _timeout_error(req) if req.deadline is not None and now >= req.deadline else None
            )


def _timeout_error(req: GenerateRequest) -> EngineError:
    seconds = req.deadline - req.submitted
    return EngineError(ErrorKind.TIMEOUT, f"the request did not finish within its timeout of {seconds:.3g} s")


def _shutdown_error() -> EngineError:
    return EngineError(ErrorKind.SHUTDOWN, "the server is shutting down; retry on another instance or later")
