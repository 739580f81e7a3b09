"""The engine: one thread that owns the llama context and runs N slots.

Each step reads like this:

    inbox  -> admit waiting requests to slots (reusing what the slots hold)
    plan   -> one batch: a token for every decoding slot + bounded prefill chunks
    decode -> one llama_decode
    post   -> sample, stream text out, finish requests, take checkpoints

Nothing outside this thread touches the context. The HTTP side talks to the engine through
`submit`, `abort` and `call`, which only put messages into the inbox.

`Engine` is the API any thread may call and the thread's life: it loads the model, runs
steps until stopped, recovers from a step that failed, sleeps and wakes
(--sleep-idle-seconds), publishes what the HTTP side reads, and shuts down. It owns, for
the engine's whole life: `Admission` (the inbox and the requests waiting for a slot),
`Outbox` (events back to the requests, the end of a request), `Lifecycle` (deadlines and
draining, through the `Running` contract) and `EngineDemand` (what the queue, the sessions
and the slots ask of the tiers). Per load (`loaded: Loaded | None`, loaded.py): the model,
its context and the parts on it, with the step (`Stepper`, stepper.py) and the admission of
waiting requests (`Admitter`, admitter.py) built on them.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from typing import Any, Callable, Iterator

from .admission import Admission, PromptLimits
from .lifecycle import Lifecycle
from ..llama_api import LlamaError
from ..step.outbox import Outbox
from ..requests import EngineError, ErrorKind, Event, FinishReason, GenerateRequest, NotReady
from ..settings import EngineConfig
from ..slot import Slot
from .snapshot import EngineInfo, EngineSnapshot, take_snapshot
from ..stats import CopyCause, EngineStats
from ..vocab import Vocab
from .admitter import Admitter
from .demand import EngineDemand
from .loaded import Loaded, UnloadedContext, load
from .stepper import Stepper

__all__ = ["Engine", "EngineConfig"]

log = logging.getLogger("warmslot.engine")

# a step publishes the light snapshot when a slot's request or phase changed, else at most
# this often: describing every sequence is work that grows with the spare sequences, and a
# decode step of one stream need not pay for dozens of idle ones each time
PUBLISH_EVERY_S = 0.05


class _Part:
    """An engine attribute that reads the loaded model's part of the same name (None while
    no model is loaded)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, engine: "Engine | None", owner: type | None = None) -> Any:
        if engine is None:
            return self
        loaded = engine.loaded
        return getattr(loaded, self.name) if loaded is not None else None

    def __set__(self, engine: "Engine", value: Any) -> None:
        raise AttributeError(f"the engine's {self.name} is the loaded model's: set engine.loaded.{self.name}")


class Engine:
    """The engine: what any thread may call, and its thread (see the module docstring)."""

    model = _Part()
    ctx = _Part()
    layout = _Part()
    memory = _Part()
    router = _Part()
    prefixes = _Part()
    sampling = _Part()
    post = _Part()
    media = _Part()
    spec = _Part()
    embedder = _Part()
    reranker = _Part()
    projector = _Part()

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.stats = EngineStats()
        self.ready = threading.Event()
        self.load_error: BaseException | None = None
        self.load_progress = 0.0
        # published once the model is loaded, for any thread
        self.info: EngineInfo | None = None
        self.vocab: Vocab | None = None
        self._published: EngineSnapshot | None = None
        self._published_shape: tuple = ()  # each slot's (request id, prefill done) when last published
        self._published_at = 0.0
        # the engine thread's: the loaded model (None before it loads and while asleep), the
        # step and the admission built on it; the tiers that outlive a load
        self.loaded: Loaded | None = None
        self.stepper: Stepper | None = None
        self.admitter: Admitter | None = None
        self.cache = None  # the RAM prompt cache (PromptCache), when on
        self.disk = None  # the disk tier (tiers.disk.DiskTier), when on
        self._thread: threading.Thread | None = None
        self._asleep: UnloadedContext | None = None  # what the snapshot needs while the model is unloaded
        self._reload: EngineConfig | None = None  # loads the same parts again (waking from sleep)
        # collaborators: the queue in front of the slots, the events back to the requests,
        # deadlines and draining, and what the tiers ask of the queue and the slots
        self.admission = Admission(self.stats, config.max_queue, config.n_parallel)
        self.outbox = Outbox(self.stats, on_finish=self._finished_well)
        self.lifecycle = Lifecycle(self, self.admission)
        self.demand = EngineDemand(self.admission, self.outbox.sessions, lambda: self.slots, self.call)

    @property
    def slots(self) -> list[Slot]:
        return self.loaded.slots if self.loaded is not None else []

    # -- public API (any thread) -------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name="warmslot-engine", daemon=True)
        self._thread.start()

    def wait_ready(self, timeout: float | None = None) -> None:
        if not self.ready.wait(timeout):
            raise TimeoutError("the model did not load in time")
        if self.load_error is not None:
            raise NotReady(f"the model failed to load: {self.load_error}") from self.load_error

    def submit(self, req: GenerateRequest) -> None:
        """Queue a request. Raises NotReady, QueueFull, ShuttingDown, or Rejected for a
        request that can never run (see admission.py)."""
        if not self.ready.is_set() or self.load_error is not None:
            raise NotReady("the model is loading")
        if self._asleep is not None:
            raise NotReady("the model is asleep (--sleep-idle-seconds): wake it first")
        self.admission.submit(req)

    def abort(self, request_id: str) -> None:
        self.admission.abort(request_id)

    def call(self, fn: Callable[["Engine"], Any]) -> concurrent.futures.Future:
        """Run fn(engine) on the engine thread between steps; returns a Future of its result."""
        return self.admission.call(fn)

    def drain(self) -> concurrent.futures.Future:
        """Take no new requests and fail the waiting ones; running requests go on."""
        return self.lifecycle.drain()

    def end_running(self) -> concurrent.futures.Future:
        """End every running (and waiting) request with a SHUTDOWN error."""
        return self.lifecycle.end_running()

    @property
    def draining(self) -> bool:
        return self.lifecycle.draining

    def n_unfinished(self) -> int:
        """Requests submitted and not finished (as of the last step)."""
        return self.lifecycle.n_unfinished()

    @property
    def started(self) -> bool:
        return self._thread is not None

    def stop(self, timeout: float = 30.0) -> None:
        self.admission.stop()
        if self._thread is not None:
            self._thread.join(timeout)

    # -- what the lifecycle may do (lifecycle.Running) ---------------------------------

    def running(self) -> Iterator[Slot]:
        return (slot for slot in self.slots if slot.active is not None)

    def end(self, slot: Slot, error: EngineError) -> None:
        self.outbox.finish(slot, FinishReason.STOP, error)

    def deliver(self) -> None:
        self.outbox.flush(self.slots)

    def n_running(self) -> int:
        snap = self._published
        return sum(1 for s in snap.slots if s.state != "idle") if snap is not None else 0

    # -- the thread's life -------------------------------------------------------------

    def _main(self) -> None:
        try:
            self._load()
        except BaseException as exc:  # noqa: BLE001 - reported through load_error
            if isinstance(exc, LlamaError):
                log.error("loading the model failed: %s", exc)
            else:
                log.exception("loading the model failed")
            self.load_error = exc
            self.ready.set()
            return
        self.ready.set()
        try:
            while not self.admission.stopped:
                try:
                    self._step()
                except Exception:  # noqa: BLE001 - the engine must outlive any one failure
                    log.exception("engine step failed; failing the running requests")
                    self._recover()
        finally:
            self._shutdown()

    def _step(self) -> None:
        host = self.loaded.ctx.host if self.loaded is not None else self._asleep.host
        self.admission.take(self._has_work, host.idle, self._run_call)
        if self.admission.stopped or self.loaded is None:
            return  # asleep: calls only (a request wakes the engine first)
        self.stepper.step()
        self._publish(force=False)

    def _run_call(self, call: tuple[Callable[[Any], Any], concurrent.futures.Future]) -> None:
        fn, fut = call
        try:
            fut.set_result(fn(self))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            fut.set_exception(exc)

    def _has_work(self) -> bool:
        """Slots running, or requests that may be admitted (none while asleep)."""
        return self.stepper is not None and self.stepper.has_work()

    def _finished_well(self, slot: Slot) -> None:
        """A request ended well (its slot still holds it): the n-gram drafter remembers it."""
        spec = self.loaded.spec if self.loaded is not None else None
        if spec is not None and spec.memory is not None:
            spec.remember(slot)

    def _recover(self) -> None:
        """After an unexpected error: fail every running request and reset its sequence, so
        no request waits forever and no slot stays in an unknown state."""
        error = EngineError(ErrorKind.INTERNAL, "internal engine error; the request was not completed")
        for slot in self.slots:
            if slot.active is not None:
                try:
                    self.outbox.finish(slot, FinishReason.STOP, error)
                except Exception:  # noqa: BLE001 - the request still hears that it failed
                    slot.active.req.sink.push([Event(error=error)])
                    slot.active = None
                self.memory.clear(slot)
        if self.post is not None:
            self.post.drop_checkpoints()
        self.outbox.flush(self.slots)

    def _load(self) -> None:
        last = [-1]

        def progress(p: float) -> None:
            self.load_progress = p
            pct = int(p * 100)
            if pct >= last[0] + 10 or pct == 100:
                last[0] = pct
                log.info("loading model: %d%%", pct)

        self._install(load(self.config, self.stats, progress, outbox=self.outbox, demand=self.demand))

    def _install(self, loaded: Loaded) -> None:
        """The loaded model's parts go to work: the step and the admission are built on them."""
        self.loaded, self._reload = loaded, loaded.reload
        self.cache, self.disk, self.vocab, self.info = loaded.cache, loaded.disk, loaded.vocab, loaded.info
        self.admitter = Admitter(
            self.admission, loaded.router, loaded.prefixes, loaded.memory, loaded.post, loaded.model, loaded.ctx, self.stats,
            disk=loaded.disk, adapters=loaded.adapters is not None,
        )
        self.stepper = Stepper(loaded, self.admitter, self.admission, self.outbox, self.lifecycle, self.config, self.stats)
        ctx = loaded.ctx
        self.admission.open(PromptLimits(
            ctx.n_ctx_seq, loaded.model.n_vocab, loaded.projector is not None, len(loaded.adapters) if loaded.adapters else 0,
        ), loaded.slots)
        self._publish()

    def _shutdown(self) -> None:
        for slot in self.slots:
            if slot.active is not None:
                self.outbox.finish(slot, FinishReason.ABORT)
        self.outbox.flush(self.slots)
        if self.disk is not None:
            for slot in self.slots:  # shifted chunks' KV (--cache-reuse) is not written to disk
                self.memory.keep_exact(slot)
            self.disk.shutdown(self.slots, lambda seq: self.ctx.state_get(seq, partial=False), draft_of=self.memory.draft_state)
        model = self.model
        if self.loaded is not None:
            self.loaded.close_parts()
        # NOTE: other threads tokenize with the model's vocabulary (a long text takes seconds
        # inside llama.cpp); freeing the model under them crashes the process, so it is freed
        # only once none does. The process is exiting anyway when one still runs.
        if model is not None and (self.vocab is None or self.vocab.retire(timeout=1.0)):
            model.close()
        elif model is not None:
            log.warning("shutting down: a tokenization is still running; the model is left to the process exit")

    # -- sleep (--sleep-idle-seconds) --------------------------------------------------

    @property
    def asleep(self) -> bool:
        return self._asleep is not None

    def sleep(self) -> concurrent.futures.Future:
        """Free the model and its contexts, keeping the prompt cache and the disk tier (idle
        slots' contents move to the prompt cache first). A Future of True once asleep, False
        when a request runs or waits, or another thread still tokenizes (nothing is freed)."""
        return self.call(lambda engine: engine._sleep())

    def wake(self) -> concurrent.futures.Future:
        """Load the model again as it was loaded (a no-op when awake); a Future of None."""
        return self.call(lambda engine: engine._wake())

    def _sleep(self) -> bool:
        if self._asleep is not None:
            return True
        if self._has_work() or self.admission.waiting:
            return False
        if not self.vocab.retire(timeout=1.0):
            self.vocab.reopen()
            return False
        loaded = self.loaded
        parked = 0
        for slot in loaded.slots:
            if slot.tokens and self.cache is not None:
                loaded.memory.save(slot, CopyCause.SLEEP, keep=0)  # the context goes
                parked += 1
        self._asleep = UnloadedContext(loaded.ctx.memory_kind, loaded.ctx.n_ctx, loaded.ctx.host, loaded.ctx.unified)
        loaded.close()
        self.loaded = self.stepper = self.admitter = None
        self._publish()
        log.info("asleep: the model is unloaded (%d idle slots moved to the prompt cache)", parked)
        return True

    def _wake(self) -> None:
        if self._asleep is None:
            return
        started = time.monotonic()
        loaded = load(self._reload, self.stats, lambda p: None, outbox=self.outbox, demand=self.demand, kept=(self.cache, self.disk))
        self._asleep = None
        self._install(loaded)
        self.stats.wakes += 1
        log.info("awake: the model loaded again in %.1f s", time.monotonic() - started)

    # -- what the HTTP side reads ------------------------------------------------------

    def snapshot(self, *, detail: bool = False, timeout: float = 10.0, visible: Callable[[str], bool] | None = None) -> EngineSnapshot | None:
        """The slots, queue and prompt cache. detail=False: the view published after the last
        step (any thread, no wait; None before the model is loaded). detail=True: a fresh one
        with every checkpoint and cache entry, taken on the engine thread between steps; only
        tenants for which `visible(tenant)` holds show their details (None: all)."""
        if not detail:
            return self._published
        return self.call(lambda engine: engine._take_snapshot(detail=True, visible=visible)).result(timeout)

    @property
    def cache_stats(self):
        """The prompt cache's counters (plain numbers, read at scrape time); None without a cache."""
        return self.cache.stats if self.cache is not None else None

    @property
    def disk_view(self):
        """The disk tier's sizes and counters (a copy; any thread); None without one."""
        return self.disk.view() if self.disk is not None else None

    @property
    def queue_depth(self) -> int:
        return self.admission.n_queued

    def _take_snapshot(self, *, detail: bool, visible: Callable[[str], bool] | None = None) -> EngineSnapshot:
        return take_snapshot(
            self.slots, self.cache, self.ctx or self._asleep, self.queue_depth, detail=detail, visible=visible, stats=self.stats,
        )

    def _publish(self, *, force: bool = True) -> None:
        """Replace the light snapshot that /metrics reads (one reference swap). Unforced (after
        a step): only when a slot took, finished or advanced a request's phase, or
        PUBLISH_EVERY_S after the last one."""
        now = time.monotonic()
        shape = tuple((s.active.req.id, s.active.prefill_done) if s.active is not None else None for s in self.slots)
        if not force and shape == self._published_shape and now - self._published_at < PUBLISH_EVERY_S:
            return
        self._published = self._take_snapshot(detail=False)
        self._published_shape, self._published_at = shape, now
