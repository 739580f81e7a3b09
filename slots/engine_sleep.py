"""Sleep (--sleep-idle-seconds): the model and its contexts are freed while the server is
idle, the prompt cache and the disk tier are kept (idle slots' contents move to the prompt
cache first), and the model is loaded again as it was before the next request runs. Part
of `Engine` (engine.py)."""

from __future__ import annotations

import concurrent.futures
import logging
import time
from dataclasses import dataclass
from typing import Any

from .llama_api import MemoryKind
from .loader import load_parts
from .stats import CopyCause

log = logging.getLogger("warmslot.engine")


@dataclass(frozen=True, slots=True)
class UnloadedContext:
    """The context's facts a snapshot shows while the model is unloaded."""

    memory_kind: MemoryKind
    n_ctx: int
    host: Any  # the host buffers the prompt cache's entries live in


class EngineSleep:
    """Unloading the model and loading it again (`sleep` and `wake` from any thread)."""

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
        parked = 0
        for slot in self.slots:
            if slot.tokens and self.cache is not None:
                self.memory.save(slot, CopyCause.SLEEP, keep=0)  # the context goes
                parked += 1
        self._asleep = UnloadedContext(self.ctx.memory_kind, self.ctx.n_ctx, self.ctx.host)
        self._close_parts()
        self.model.close()
        self.model = self.ctx = self.sampling = self.spec = self.embedder = self.reranker = self.projector = None
        self.outbox.on_finish = None
        self.post = self.media = self.memory = self.router = self.prefixes = self._batch = None
        self.slots = []
        self._publish()
        log.info("asleep: the model is unloaded (%d idle slots moved to the prompt cache)", parked)
        return True

    def _wake(self) -> None:
        if self._asleep is None:
            return
        started = time.monotonic()
        parts = load_parts(self._reload, self.stats, lambda p: None, wake=lambda fn: self.call(lambda engine: fn()),
                           kept=(self.cache, self.disk))
        self._asleep = None
        self._install(parts)
        self.stats.wakes += 1
        log.info("awake: the model loaded again in %.1f s", time.monotonic() - started)

