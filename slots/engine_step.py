"""One engine step: the calls and aborts from the inbox, expired deadlines, admission,
images and drafts, then the plan (`plan_batch`), its one decode and what follows it
(sampling, verifying drafts, checkpoints), and the view published for other threads. When
the KV pool cannot take the batch, or the decode fails, the step gives way here (see
`_on_kv_full`). Part of `Engine` (engine.py)."""

from __future__ import annotations

import concurrent.futures
import logging
import time
from typing import Any, Callable

from .fairness import longest_over_share
from .requests import EngineError, ErrorKind, FinishReason
from .scheduler import BatchEntry, plan_batch, timed_prefill_cap

log = logging.getLogger("warmslot.engine")


MIN_CHUNK_ON_PRESSURE = 32  # below this, a prefill that does not fit fails its request


class EngineStep:
    """The step the engine thread runs in a loop, and the decode at its heart."""

    def _step(self) -> None:
        host = self.ctx.host if self._asleep is None else self._asleep.host
        self.admission.take(self._has_work, host.idle, self._run_call)
        if self.admission.stopped or self._asleep is not None:
            return  # asleep: calls only (a request wakes the engine first)
        t0 = time.monotonic()
        self._reap_aborts()
        self.lifecycle.expire_deadlines()
        self._admit()
        if self.media is not None:
            # images are decoded apart from the batch; one that ends at a checkpoint position
            # is checkpointed now, before this step's batch carries its prefill on
            for slot, n in self.media.run(self.slots):
                self.memory.checkpoint(slot, n, None)
        if self.spec.model_drafts:  # its decodes come first: what the last step emitted goes out now
            self.outbox.flush(self.slots)
        drafts = self.spec.drafts(self.slots, self._batch.capacity, self.ctx.n_ubatch, self.memory.fork_pending)
        entries = plan_batch(
            self.slots, self._batch, self._prefill_budget(),
            by_sequence=not self.ctx.unified, filler_budget=self._filler_budget, drafts=drafts,
        )
        if entries:
            self._run(entries)  # flushes the previous step's events once its decode is launched
        else:
            self.outbox.flush(self.slots)
        if self.memory.fork_pending:
            self.memory.settle_fork(self._batch)
        self.post.take_checkpoints()
        if not self._has_work():
            self.outbox.flush(self.slots)  # nothing will run next: do not hold events back
        self.stats.step_seconds += time.monotonic() - t0
        self._publish(force=False)

    def _run_call(self, call: tuple[Callable[[Any], Any], concurrent.futures.Future]) -> None:
        fn, fut = call
        try:
            fut.set_result(fn(self))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            fut.set_exception(exc)

    def _has_work(self) -> bool:
        """Slots running, or requests that may be admitted (not those waiting for a disk read)."""
        if self._asleep is not None:
            return False
        return any(s.active is not None for s in self.slots) or any(
            self.disk is None or not self.disk.waiting(r.id) for r in self.admission.waiting)

    def _reap_aborts(self) -> None:
        aborts = self.admission.take_aborts()
        if not aborts:
            return
        for slot in self.slots:
            if slot.active is not None and slot.active.req.id in aborts:
                self.outbox.finish(slot, FinishReason.ABORT)
        self.admission.drop_aborted(aborts)

    # -- one decode --------------------------------------------------------------------

    def _prefill_budget(self) -> int:
        """Prefill tokens allowed in this step: bounded while other streams are decoding."""
        cap = self._batch.capacity
        if any(s.active is not None and s.active.prefill_done for s in self.slots):
            cap = min(cap, self.config.prefill_chunk or self.ctx.n_ubatch)
        if self._chunk_cap:
            cap = min(cap, self._chunk_cap)
        return min(cap, timed_prefill_cap(self.stats.prefill_rate(), self.ctx.n_ubatch))

    def _run(self, entries: list[BatchEntry]) -> None:
        t0 = time.monotonic()
        shape = self.spec.shape(entries)  # before the step changes what the entries are
        rc = self.ctx.decode(self._batch)
        t1 = time.monotonic()
        self.stats.decode_call_seconds += t1 - t0
        self.memory.fork_pending = False  # llama_decode performs pending stream copies first
        if rc != 0:
            for entry in entries:
                if entry.filler:
                    self.ctx.seq_rm(entry.slot.id, entry.slot.pos(entry.start), -1)
            entries = [e for e in entries if not e.filler]
        if rc == 1:
            if not self.spec.kv_full(entries):  # drafts give way first
                self._on_kv_full(entries)
            return
        if rc != 0:
            self._on_decode_error(entries, rc)
            return
        # the decode runs asynchronously on a GPU: hand the previous step's events to the
        # HTTP side now, so streaming them overlaps the computation instead of delaying it
        self.outbox.flush(self.slots)
        self._chunk_cap = 0
        t2 = time.monotonic()
        self.ctx.synchronize()
        self.stats.device_wait_seconds += time.monotonic() - t2
        self.spec.after_decode(entries, self._batch)  # the MTP block follows what was decoded
        n_decode = sum(e.n for e in entries if e.is_decode)  # drafted tokens included
        n_filler = sum(1 for e in entries if e.filler)
        to_sample: list[BatchEntry] = []
        to_verify: list[BatchEntry] = []
        for entry in entries:
            slot = entry.slot
            if entry.filler:
                self.ctx.seq_rm(slot.id, slot.pos(entry.start), -1)
                continue
            if slot.active is None:
                continue
            if entry.is_decode and entry.draft:
                to_verify.append(entry)
            elif entry.is_decode:
                slot.tokens.append(slot.active.pending)
                slot.active.pending = None
                to_sample.append(entry)
            elif self.post.after_prefill(slot, entry):
                to_sample.append(entry)
        tokens = self.sampling.sample([(e.slot.active.sampler, e.out_index) for e in to_sample])
        for entry, token in zip(to_sample, tokens):
            self.post.on_sample(entry.slot, token, entry.out_index)
        # a rejected drafted token counts as neither prompt nor generated
        n_rejected = sum(len(e.draft) - self.spec.verify(e, self.post) for e in to_verify)
        for slot in self.spec.settle():  # recurrent and hybrid memory: the drafts cut, rolled back
            if slot.active is not None:
                self.outbox.finish(slot, FinishReason.STOP, EngineError(ErrorKind.INTERNAL, "rolling back a draft failed"))
        self.stats.filler_tokens += n_filler
        self.stats.busy_slot_steps += len({e.slot.id for e in entries if not e.filler})
        self.stats.spec_verify_steps += len(to_verify)
        seconds = time.monotonic() - t0
        self.stats.record_step(self._batch.n - n_decode - n_filler, n_decode - n_rejected, seconds)
        self.spec.observe(shape, seconds)

    # -- failures ----------------------------------------------------------------------

    def _on_kv_full(self, entries: list[BatchEntry]) -> None:
        """No room in the KV pool for this batch (memory is unchanged). Free idle slots' cells,
        least recently used first; then try smaller prefill chunks; then end the generation
        furthest past its fair share of the pool; then fail the newest request."""
        if self.prefixes.evict_idle():
            return
        prefill = [e for e in entries if not e.is_decode]
        largest = max((e.n for e in prefill), default=0)
        if largest > MIN_CHUNK_ON_PRESSURE:
            self._chunk_cap = largest // 2  # fragmented cells may still fit a smaller chunk
            return
        greedy = longest_over_share(self.slots, self.ctx.n_ctx, self.config.n_parallel)
        if greedy is not None:  # see fairness.py
            log.info("slot %d: the KV pool is full; ending its generation at %d tokens, past its fair share", greedy.id, greedy.n_past)
            self.outbox.finish(greedy, FinishReason.LENGTH)
            return
        newest = max((e.slot for e in entries), key=lambda s: s.active.admitted)
        log.warning("slot %d: the KV pool is full; failing request %s", newest.id, newest.active.req.id)
        self.outbox.finish(newest, FinishReason.STOP, EngineError(
            ErrorKind.BUSY, "the KV cache is full with other requests; retry later or raise --ctx-size"
        ))
        self.memory.clear(newest)

    def _on_decode_error(self, entries: list[BatchEntry], rc: int) -> None:
        log.error("llama_decode failed with %d; failing %d requests", rc, len(entries))
        for entry in entries:
            slot = entry.slot
            if slot.active is not None:
                self.outbox.finish(slot, FinishReason.STOP, EngineError(ErrorKind.INTERNAL, f"llama_decode failed ({rc})"))
            # processed ubatches may remain in memory: start this sequence over
            self.memory.clear(slot)
