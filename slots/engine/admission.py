"""Admission: what any thread hands the engine, and the requests waiting for a slot.

Any thread calls `submit`, `abort`, `call`, `close` and `stop`: they check what can be
checked at once (the model is loaded, the prompt fits a slot, the queue has room, the engine
is not draining), put a message into the inbox and wake the engine. The engine thread takes
the inbox once per step (`take`), which moves submissions to `waiting` and aborts to a set it
reaps, and gives waiting requests slots in arrival order (`Engine._admit`).

A request counts as queued from `submit` until it gets a slot (`admitted`) or is failed
while waiting (`fail_waiting`, `drop_aborted`): `n_queued` is what --max-queue bounds.
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..adapters.adapter_set import NO_ADAPTERS, AdapterSet
from ..requests import (
    EngineError, ErrorKind, Event, FinishReason, GenerateRequest, NotReady, QueueFull, Rejected, ShuttingDown, Usage,
)
from ..multimodal.spans import MediaSpan, check_media
from ..slot import Slot
from ..stats import EngineStats

Call = tuple[Callable[[Any], Any], concurrent.futures.Future]


@dataclass(frozen=True, slots=True)
class PromptLimits:
    """What a prompt must satisfy to run at all (constants once the model is loaded)."""

    n_ctx_seq: int  # the most tokens one slot holds
    n_vocab: int

    has_projector: bool = False  # --mmproj: prompts may hold images
    n_adapters: int = 0  # LoRA adapters loaded (--lora): a request's ids are below it

    def check(self, tokens: Sequence[int], media: Sequence[MediaSpan] = (), adapters: AdapterSet = NO_ADAPTERS) -> EngineError | None:
        """A prompt must leave its slot room for one generated token: the one place the
        context limit is checked for a prompt (generation stops at the same limit in
        `Postprocess.on_token`)."""
        n_prompt = len(tokens)
        if n_prompt >= self.n_ctx_seq:
            return EngineError(ErrorKind.CONTEXT, f"the prompt has {n_prompt} tokens; a slot holds {self.n_ctx_seq}")
        if media or min(tokens) < 0:
            problem = check_media(tokens, media, has_projector=self.has_projector)
            if problem is not None:
                return EngineError(ErrorKind.INVALID, problem)
        if max(tokens) >= self.n_vocab:
            return EngineError(ErrorKind.INVALID, f"the prompt has token ids outside the vocabulary (0..{self.n_vocab - 1})")
        if adapters and adapters.scales[-1][0] >= self.n_adapters:
            return EngineError(ErrorKind.INVALID, f"no LoRA adapter {adapters.scales[-1][0]}: {self.n_adapters} are loaded")
        return None


class Admission:
    def __init__(self, stats: EngineStats, max_queue: int, n_parallel: int) -> None:
        self.stats = stats
        self.max_queue = max_queue
        self.n_parallel = n_parallel
        self.cv = threading.Condition()  # guards the inbox, n_queued and the flags
        self.waiting: collections.deque[GenerateRequest] = collections.deque()  # engine thread only
        self.n_queued = 0  # submitted and not yet given a slot (inbox + waiting)
        self.draining = False  # no new requests: the server is shutting down
        self.stopped = False  # the engine thread is to end
        self._inbox: collections.deque[tuple[str, Any]] = collections.deque()
        self._aborts: set[str] = set()
        self._limits: PromptLimits | None = None  # None until the model is loaded
        self._slots: Sequence[Slot] = ()

    def open(self, limits: PromptLimits, slots: Sequence[Slot]) -> None:
        """The model is loaded: accept requests from now on."""
        self._limits, self._slots = limits, slots

    # -- any thread ------------------------------------------------------------------------

    def submit(self, req: GenerateRequest) -> None:
        """Queue a request. Raises NotReady, QueueFull, ShuttingDown, or Rejected for a
        request that can never run."""
        if self._limits is None:
            raise NotReady("the model is loading")
        error = self._limits.check(req.tokens, req.media, req.adapters)
        if error is not None:
            self.stats.requests[error.kind.value] += 1
            raise Rejected(error)
        with self.cv:
            if self.draining:  # under the lock: a drain fails all that was queued before it
                raise ShuttingDown("the server is shutting down")
            # requests that idle slots will take at the next step are not waiting (a read of
            # the engine thread's state: one step stale at worst, and conservative either way)
            idle = self.n_parallel - sum(1 for slot in self._slots if slot.active is not None)
            if self.n_queued - idle >= self.max_queue:
                self.stats.queue_rejected += 1
                raise QueueFull(f"{self.n_queued - idle} requests are waiting for a slot")
            self.n_queued += 1
            self._post("submit", req)

    def abort(self, request_id: str) -> None:
        with self.cv:
            self._post("abort", request_id)

    def call(self, fn: Callable[[Any], Any]) -> concurrent.futures.Future:
        """Have the engine thread run fn(engine) between steps; a Future of its result."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self.cv:
            self._post("call", (fn, fut))
        return fut

    def close(self) -> None:
        """Refuse every later submission (ShuttingDown)."""
        with self.cv:
            self.draining = True

    def stop(self) -> None:
        with self.cv:
            self.stopped = True
            self.cv.notify()

    def _post(self, kind: str, payload: Any) -> None:
        self._inbox.append((kind, payload))
        self.cv.notify()

    # -- the engine thread -----------------------------------------------------------------

    def take(self, has_work: Callable[[], bool], idle: Callable[[bool], None], run: Callable[[Call], None]) -> None:
        """Take the inbox, in order: submissions join `waiting`, aborts are kept for
        `take_aborts`, calls are handed to `run`. With nothing to do, block until a message
        comes, telling `idle(True)` first and `idle(False)` after."""
        with self.cv:
            if not self._inbox and not self.stopped and not has_work():
                idle(True)
                while not self._inbox and not self.stopped and not has_work():
                    self.cv.wait()
                idle(False)
            messages = list(self._inbox)
            self._inbox.clear()
        for kind, payload in messages:
            if kind == "submit":
                self.waiting.append(payload)
            elif kind == "abort":
                self._aborts.add(payload)
            else:
                run(payload)

    def take_aborts(self) -> set[str]:
        """The request ids aborted since the last call (running or waiting)."""
        aborts, self._aborts = self._aborts, set()
        return aborts

    def drop_aborted(self, aborts: set[str]) -> None:
        """End the waiting requests among `aborts` as aborted."""
        kept: collections.deque[GenerateRequest] = collections.deque()
        for req in self.waiting:
            if req.id in aborts:
                self._dequeued()
                req.sink.push([Event(finish=FinishReason.ABORT, usage=Usage(len(req.tokens), 0))])
            else:
                kept.append(req)
        self.waiting = kept

    def admitted(self, i: int) -> GenerateRequest:
        """The waiting request at index i leaves the queue for a slot."""
        req = self.waiting[i]
        del self.waiting[i]
        self._dequeued()
        return req

    def fail_waiting(self, error_for: Callable[[GenerateRequest], EngineError | None]) -> None:
        """Fail every waiting request for which `error_for(req)` gives an error."""
        kept: collections.deque[GenerateRequest] = collections.deque()
        for req in self.waiting:
            error = error_for(req)
            if error is None:
                kept.append(req)
                continue
            self._dequeued()
            self.reject(req, error)
        self.waiting = kept

    def reject(self, req: GenerateRequest, error: EngineError) -> None:
        """End a request that never ran with `error` (counted by its kind)."""
        self.stats.requests[error.kind.value] += 1
        req.sink.push([Event(error=error)])

    def _dequeued(self) -> None:
        with self.cv:
            self.n_queued -= 1
