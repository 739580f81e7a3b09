"""The engine thread's life: it loads the model and installs the parts built on it, runs
steps until it is stopped, fails the running requests when a step raises (the engine
outlives any one failure), and shuts down: running requests end, the disk tier gets the
slots' contents, and the parts and the model are freed. Part of `Engine` (engine.py)."""

from __future__ import annotations

import logging

from .admission import PromptLimits
from .llama_api import LlamaError
from .loader import load_parts
from .multimodal.prefill import MediaPrefill
from .postprocess import Postprocess
from .requests import EngineError, ErrorKind, Event, FinishReason
from .speculation.draft_model import load_draft
from .speculation.speculator import Speculator

log = logging.getLogger("warmslot.engine")


class EngineThread:
    """The thread's main loop, loading, recovery and shutdown (engine thread only)."""

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

        self._install(load_parts(self.config, self.stats, progress, wake=lambda fn: self.call(lambda engine: fn())))

    def _install(self, parts) -> None:
        self._reload = parts.reload
        self.model, self.ctx, self.layout, self.cache = parts.model, parts.ctx, parts.layout, parts.cache
        self.slots, self.memory, self.router, self.prefixes = parts.slots, parts.memory, parts.router, parts.prefixes
        self._batch, self.sampling, self._filler_budget = parts.batch, parts.sampling, parts.filler_budget
        self.vocab, self.info, self.disk, self.embedder = parts.vocab, parts.info, parts.disk, parts.embedder
        self.reranker = parts.reranker
        waiting = lambda: self.admission.waiting  # noqa: E731 - engine thread only, like its readers
        self.router.waiting = self.prefixes.waiting = waiting
        self.router.sessions = self.prefixes.sessions = lambda: self.outbox.sessions.active(self.slots)
        if self.cache is not None:
            self.cache.upcoming = lambda: ((r.tenant, r.tokens) for r in waiting())
            slots = self.slots
            self.cache.on_device = lambda: ((s.tenant, s.tokens) for s in slots if s.tokens)
            self.cache.sessions = lambda: (self.outbox.sessions.active(slots), ((r.tenant, r.session) for r in waiting()))
            cache = self.cache  # a shared budget shrank under it: it gives entries back on this thread
            self.cache.on_over = lambda: self.call(lambda engine: cache.trim())
        self.post = Postprocess(self.model, self.ctx, self.memory, self.outbox, self.stats)
        if parts.projector is not None:
            self.projector = parts.projector
            self.media = MediaPrefill(
                parts.projector, self.ctx, self.memory, self.outbox, self.stats, truncatable=self.ctx.memory_kind.truncatable,
            )
        self.spec = Speculator(self.config.spec, self.ctx, self.stats, self.model.info.n_swa, load_draft(self.config, self.model, self.ctx, self.stats))
        self.memory.drafter = self.spec.draft_model
        self.outbox.on_finish = self.spec.remember if self.spec.memory is not None else None
        self.admission.open(PromptLimits(self.ctx.n_ctx_seq, self.model.n_vocab, parts.projector is not None), self.slots)
        self._publish()

    def _shutdown(self) -> None:
        for slot in self.slots:
            if slot.active is not None:
                self.outbox.finish(slot, FinishReason.ABORT)
        self.outbox.flush(self.slots)
        if self.disk is not None:
            self.disk.shutdown(self.slots, lambda seq: self.ctx.state_get(seq, partial=False), draft_of=self.memory.draft_state)
        self._close_parts()
        # NOTE: other threads tokenize with the model's vocabulary (a long text takes seconds
        # inside llama.cpp); freeing the model under them crashes the process, so it is freed
        # only once none does. The process is exiting anyway when one still runs.
        if self.model is not None and (self.vocab is None or self.vocab.retire(timeout=1.0)):
            self.model.close()
        elif self.model is not None:
            log.warning("shutting down: a tokenization is still running; the model is left to the process exit")

    def _close_parts(self) -> None:
        """Free what was built on the model (the model itself stays: see _shutdown, _sleep)."""
        for part in (self.sampling, self.spec, self.ctx, self.embedder, self.reranker, self.projector):
            if part is not None:
                part.close()
