"""The models of a server with several, by name: which one a request's `model` picks, loading
it on demand, and unloading the least recently used idle one when `--models-max` are loaded.

Each model is served by its own host (a `state.ModelHost`: its engine thread, its llama
context, its prompt builder), made by the app; this module knows of it only what `Served`
says. Unloading is the engine's sleep: the idle slots' contents move into the model's RAM
prompt cache and its disk tier stays, so a conversation comes back warm after a reload.

Transitions run as one asyncio task per model (`ModelEntry.transition`): the requests that
wait for a model wait on its task together, each up to `--models-load-timeout`, and a
request for a model being unloaded waits for the unload, then loads it again.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from warmslot.slots import NotReady

from ..errors import ModelNotFound, ServerError, Unavailable
from .catalog import ModelSpec, NameMatcher

log = logging.getLogger("warmslot.models")

POLL_S = 0.05  # how often a load that waits for room looks again
WATCH_S = 0.25  # how often idle models are checked against their keep-alive


class ModelState(enum.Enum):
    UNLOADED = "unloaded"  # never loaded (or its load failed)
    LOADING = "loading"
    LOADED = "loaded"
    UNLOADING = "unloading"
    SLEEPING = "sleeping"  # unloaded after a load: its prompt cache and disk tier kept


class Served(Protocol):
    """What the registry needs of a model's host."""

    engine: Any

    def finish_loading(self) -> None: ...

    def renew_engine(self) -> None: ...


@dataclass(eq=False)
class ModelEntry:
    """One model: its spec, its host, where it stands and its counters."""

    spec: ModelSpec
    host: Served
    keep_alive: float  # seconds it stays loaded without a request (inf: until room is needed)
    state: ModelState = ModelState.UNLOADED
    in_flight: int = 0  # requests that picked it and have not finished
    last_used: float = 0.0  # time.monotonic() of its last request's start or end
    expires: float = float("inf")  # when it is unloaded if still idle
    transition: asyncio.Task | None = None
    counts: dict[str, int] = field(default_factory=lambda: {"requests": 0, "loads": 0, "unloads": 0, "load_failures": 0})
    error: str | None = None  # why the last load failed

    @property
    def name(self) -> str:
        return self.spec.name

    def idle(self) -> bool:
        """Loaded, with no request in flight, nothing running or queued, and no transition."""
        engine = self.host.engine
        return (self.state is ModelState.LOADED and self.in_flight == 0 and self.transition is None
                and engine.n_unfinished() == 0 and engine.queue_depth == 0)


class Models:
    """The registry. `default`: the model an unknown name is served by (None: 404); a
    request that names no model gets the default, else the first."""

    def __init__(self, entries: list[ModelEntry], *, max_loaded: int, default: str | None, load_timeout: float) -> None:
        assert entries and max_loaded >= 1
        self.entries = {entry.name: entry for entry in entries}
        self.max_loaded = max_loaded
        self.default = default
        self.load_timeout = load_timeout
        self.matcher = NameMatcher([(e.name, e.spec.patterns) for e in entries])
        assert default is None or default in self.entries

    @property
    def first(self) -> ModelEntry:
        return next(iter(self.entries.values()))

    def resolve(self, wanted: Any) -> ModelEntry:
        """The model a request's `model` picks (pure). Raises ModelNotFound (404)."""
        if wanted is None or wanted == "":
            return self.entries[self.default] if self.default else self.first
        name = self.matcher.match(wanted) if isinstance(wanted, str) else None
        if name is None and self.default is not None:
            name = self.default
        if name is None:
            raise ModelNotFound(str(wanted))
        return self.entries[name]

    # -- using a model --------------------------------------------------------------------

    async def acquire(self, entry: ModelEntry) -> Served:
        """The model's host, loaded (waiting for a load, up to --models-load-timeout:
        then 503 with Retry-After). Counts the request in flight until `release`."""
        entry.in_flight += 1
        try:
            await self._loaded(entry)
        except BaseException:
            entry.in_flight -= 1
            raise
        entry.counts["requests"] += 1
        entry.last_used = time.monotonic()
        return entry.host

    def release(self, entry: ModelEntry, keep_alive: float | None = None) -> None:
        """A request ended: the model stays loaded `keep_alive` seconds from now (the request's
        own, else the model's) unless another request comes."""
        entry.in_flight -= 1
        assert entry.in_flight >= 0
        now = time.monotonic()
        entry.last_used = now
        entry.expires = now + (entry.keep_alive if keep_alive is None else keep_alive)

    async def _loaded(self, entry: ModelEntry) -> None:
        deadline = time.monotonic() + self.load_timeout
        while entry.state is not ModelState.LOADED:
            if entry.transition is None:
                self._start(entry, self._load(entry))
            try:
                await asyncio.wait_for(asyncio.shield(entry.transition), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise Unavailable(f"the model '{entry.name}' is loading", retry_after=5, code="loading") from None

    def _start(self, entry: ModelEntry, work) -> asyncio.Task:
        task = asyncio.ensure_future(work)
        entry.transition = task

        def done(t: asyncio.Task) -> None:
            if entry.transition is t:
                entry.transition = None
            if not t.cancelled():
                t.exception()  # retrieved here: a waiter that timed out does not see it

        task.add_done_callback(done)
        return task

    # -- loading and unloading ------------------------------------------------------------

    async def _load(self, entry: ModelEntry) -> None:
        await self._make_room(entry)
        # NOTE: LOADING only once there is room: loads that wait for room do not count as
        # loaded, or two of them would each wait for the other to be unloaded
        before = entry.state
        entry.state = ModelState.LOADING
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        try:
            engine = entry.host.engine
            if not engine.started:
                engine.start()
            else:  # sleeping: loaded again as it was, its prompt cache kept
                await asyncio.wrap_future(engine.wake())
            await loop.run_in_executor(None, entry.host.finish_loading)
        except NotReady as exc:
            entry.counts["load_failures"] += 1
            entry.error = str(exc)
            entry.state = ModelState.UNLOADED
            log.error("model %s: %s", entry.name, exc)
            await loop.run_in_executor(None, entry.host.engine.stop)
            entry.host.renew_engine()  # a fresh engine: the next request tries again
            raise ServerError(f"the model '{entry.name}' failed to load: {exc}") from None
        except BaseException:
            entry.state = before
            raise
        entry.state = ModelState.LOADED
        entry.error = None
        entry.counts["loads"] += 1
        entry.last_used = time.monotonic()
        entry.expires = entry.last_used + entry.keep_alive
        log.info("model %s: loaded in %.1f s", entry.name, entry.last_used - started)

    async def _make_room(self, entry: ModelEntry) -> None:
        """Unload the least recently used idle models until `entry` fits under --models-max;
        wait while none is idle (up to --models-load-timeout: then 503)."""
        deadline = time.monotonic() + self.load_timeout
        held = (ModelState.LOADED, ModelState.LOADING, ModelState.UNLOADING)
        while sum(1 for e in self.entries.values() if e is not entry and e.state in held) >= self.max_loaded:
            idle = [e for e in self.entries.values() if e is not entry and e.idle()]
            if idle:
                victim = min(idle, key=lambda e: e.last_used)
                log.info("model %s: unloaded to make room for %s", victim.name, entry.name)
                if not await self._start(victim, self._unload(victim)):
                    await asyncio.sleep(POLL_S)  # busy after all (a tokenization held its vocabulary)
                continue
            if time.monotonic() >= deadline:
                raise Unavailable(f"--models-max {self.max_loaded} models are loaded and busy", retry_after=5, code="models_busy")
            await asyncio.sleep(POLL_S)

    async def _unload(self, entry: ModelEntry) -> bool:
        entry.state = ModelState.UNLOADING
        try:
            done = await asyncio.wrap_future(entry.host.engine.sleep())
        except BaseException:
            entry.state = ModelState.LOADED
            raise
        entry.state = ModelState.SLEEPING if done else ModelState.LOADED
        if done:
            entry.counts["unloads"] += 1
        return done

    async def load(self, entry: ModelEntry) -> None:
        """Load a model now (as a request would: room made, the wait bounded)."""
        await self.acquire(entry)
        self.release(entry)

    async def unload(self, entry: ModelEntry) -> bool:
        """Unload a model now; False when it is busy (a request runs or waits) or not loaded."""
        while entry.transition is not None:
            await asyncio.shield(entry.transition)
        if not entry.idle():
            return False
        return await self._start(entry, self._unload(entry))

    async def watch(self) -> None:
        """Unload the models idle past their keep-alive (a background task)."""
        while True:
            await asyncio.sleep(WATCH_S)
            now = time.monotonic()
            for entry in self.entries.values():
                if entry.idle() and now >= entry.expires:
                    log.info("model %s: unloaded after its keep-alive", entry.name)
                    self._start(entry, self._unload(entry))

    def hosts(self) -> list[Served]:
        return [entry.host for entry in self.entries.values()]
