"""One engine step: aborts, expired deadlines, admission, images and drafts, then the plan
(`plan_batch`), its one decode and what follows it (sampling, verifying drafts,
checkpoints). When the KV pool cannot take the batch, or the decode fails, the step gives
way here (see `_on_kv_full`). The engine takes the inbox before each step and publishes
its view after it (engine.py). Engine thread only."""

from __future__ import annotations

import logging
import time

from .admission import Admission
from ..step.fairness import longest_over_share
from .lifecycle import Lifecycle
from ..step.outbox import Outbox
from ..requests import EngineError, ErrorKind, FinishReason
from ..step.adapter_turns import AdapterTurns
from ..step.scheduler import BatchEntry, plan_batch, timed_prefill_cap
from ..settings import EngineConfig
from ..slot import Slot
from ..stats import EngineStats
from .admitter import Admitter
from .loaded import Loaded

log = logging.getLogger("warmslot.engine")

__all__ = ["MIN_CHUNK_ON_PRESSURE", "Stepper"]

MIN_CHUNK_ON_PRESSURE = 32  # below this, a prefill that does not fit fails its request


class Stepper:
    """The step the engine thread runs in a loop on a loaded model, and the decode at its
    heart. It reads the parts of `loaded` as they are at each step."""

    def __init__(
        self, loaded: Loaded, admitter: Admitter, admission: Admission, outbox: Outbox, lifecycle: Lifecycle,
        config: EngineConfig, stats: EngineStats,
    ) -> None:
        self.loaded = loaded
        self.admitter = admitter
        self.admission = admission
        self.outbox = outbox
        self.lifecycle = lifecycle
        self.config = config
        self.stats = stats
        self.chunk_cap = 0  # lowered after the KV pool could not fit a batch
        self.turns = AdapterTurns()  # with LoRA adapters: whose set each step decodes

    def has_work(self) -> bool:
        """Slots running, or requests that may be admitted (not those waiting for a disk read)."""
        disk = self.loaded.disk
        return any(s.active is not None for s in self.loaded.slots) or any(
            disk is None or not disk.waiting(r.id) for r in self.admission.waiting)

    def step(self) -> None:
        """One step after the inbox was taken."""
        loaded = self.loaded
        slots, memory, spec = loaded.slots, loaded.memory, loaded.spec
        t0 = time.monotonic()
        self._reap_aborts()
        self.lifecycle.expire_deadlines()
        self.admitter.admit()
        if loaded.media is not None:
            # images are decoded apart from the batch; one that ends at a checkpoint position
            # is checkpointed now, before this step's batch carries its prefill on
            for slot, n in loaded.media.run(slots):
                memory.checkpoint(slot, n, None)
        if spec.model_drafts:  # its decodes come first: what the last step emitted goes out now
            self.outbox.flush(slots)
        turn = self._adapter_turn(slots) if loaded.adapters is not None else slots
        drafts = spec.drafts(turn, loaded.batch.capacity, loaded.ctx.n_ubatch, memory.fork_pending)
        entries = plan_batch(
            turn, loaded.batch, self._prefill_budget(),
            by_sequence=not loaded.ctx.unified, filler_budget=loaded.filler_budget, drafts=drafts,
        )
        if entries:
            self._run(entries)  # flushes the previous step's events once its decode is launched
        else:
            self.outbox.flush(slots)
        if memory.fork_pending:
            memory.settle_fork(loaded.batch)
        loaded.post.take_checkpoints()
        if not self.has_work():
            self.outbox.flush(slots)  # nothing will run next: do not hold events back
        self.stats.step_seconds += time.monotonic() - t0

    def _adapter_turn(self, slots: list[Slot]) -> list[Slot]:
        """The slots this step may decode: llama.cpp applies one LoRA adapter set to the whole
        context, so a step takes the requests of one set (step/adapter_turns.py), which it
        applies first. The slots outside the set wait for their turn."""
        chosen = self.turns.pick(slots)
        if chosen is None:
            return slots
        self.loaded.adapters.apply(self.loaded.ctx, chosen)
        return [s for s in slots if self.turns.runs(s, chosen)]

    def _reap_aborts(self) -> None:
        aborts = self.admission.take_aborts()
        if not aborts:
            return
        for slot in self.loaded.slots:
            if slot.active is not None and slot.active.req.id in aborts:
                self.outbox.finish(slot, FinishReason.ABORT)
        self.admission.drop_aborted(aborts)

    # -- one decode --------------------------------------------------------------------

    def _prefill_budget(self) -> int:
        """Prefill tokens allowed in this step: bounded while other streams are decoding."""
        cap = self.loaded.batch.capacity
        if any(s.active is not None and s.active.prefill_done for s in self.loaded.slots):
            cap = min(cap, self.config.prefill_chunk or self.loaded.ctx.n_ubatch)
        if self.chunk_cap:
            cap = min(cap, self.chunk_cap)
        return min(cap, timed_prefill_cap(self.stats.prefill_rate(), self.loaded.ctx.n_ubatch))

    def _run(self, entries: list[BatchEntry]) -> None:
        loaded = self.loaded
        ctx, batch, spec, memory, post = loaded.ctx, loaded.batch, loaded.spec, loaded.memory, loaded.post
        t0 = time.monotonic()
        shape = spec.shape(entries)  # before the step changes what the entries are
        rc = ctx.decode(batch)
        t1 = time.monotonic()
        self.stats.decode_call_seconds += t1 - t0
        memory.fork_pending = False  # llama_decode performs pending stream copies first
        if rc != 0:
            for entry in entries:
                if entry.filler:
                    ctx.seq_rm(entry.slot.id, entry.slot.pos(entry.start), -1)
            entries = [e for e in entries if not e.filler]
        if rc == 1:
            if not spec.kv_full(entries):  # drafts give way first
                self._on_kv_full(entries)
            return
        if rc != 0:
            self._on_decode_error(entries, rc)
            return
        # the decode runs asynchronously on a GPU: hand the previous step's events to the
        # HTTP side now, so streaming them overlaps the computation instead of delaying it
        # (on a CPU they went out at the end of the previous step)
        self.outbox.flush(loaded.slots)
        self.chunk_cap = 0
        t2 = time.monotonic()
        ctx.synchronize()
        self.stats.device_wait_seconds += time.monotonic() - t2
        spec.after_decode(entries, batch)  # the MTP block follows what was decoded
        n_decode = sum(e.n for e in entries if e.is_decode)  # drafted tokens included
        n_filler = sum(1 for e in entries if e.filler)
        to_sample: list[BatchEntry] = []
        to_verify: list[BatchEntry] = []
        for entry in entries:
            slot = entry.slot
            if entry.filler:
                ctx.seq_rm(slot.id, slot.pos(entry.start), -1)
                continue
            if slot.active is None:
                continue
            if entry.is_decode and entry.draft:
                to_verify.append(entry)
            elif entry.is_decode:
                slot.tokens.append(slot.active.pending)
                slot.active.pending = None
                to_sample.append(entry)
            elif post.after_prefill(slot, entry):
                to_sample.append(entry)
        tokens = loaded.sampling.sample([(e.slot.active.sampler, e.out_index) for e in to_sample])
        for entry, token in zip(to_sample, tokens):
            post.on_sample(entry.slot, token, entry.out_index)
        # a rejected drafted token counts as neither prompt nor generated
        n_rejected = sum(len(e.draft) - spec.verify(e, post) for e in to_verify)
        for slot in spec.settle():  # recurrent and hybrid memory: the drafts cut, rolled back
            if slot.active is not None:
                self.outbox.finish(slot, FinishReason.STOP, EngineError(ErrorKind.INTERNAL, "rolling back a draft failed"))
        self.stats.filler_tokens += n_filler
        self.stats.busy_slot_steps += len({e.slot.id for e in entries if not e.filler})
        self.stats.spec_verify_steps += len(to_verify)
        seconds = time.monotonic() - t0
        self.stats.record_step(batch.n - n_decode - n_filler, n_decode - n_rejected, seconds)
        spec.observe(shape, seconds)
        if not loaded.on_gpu:
            # on a CPU the next llama_decode computes before it returns: a request's start,
            # its first tokens and its end go out now, not one decode later; the rest of a
            # stream after the next decode, as on a GPU, so that the event loop's work on it
            # overlaps this thread's between decodes rather than llama.cpp's threads
            self.outbox.flush(loaded.slots, awaited_only=True)

    # -- failures ----------------------------------------------------------------------

    def _on_kv_full(self, entries: list[BatchEntry]) -> None:
        """No room in the KV pool for this batch (memory is unchanged). Free idle slots' cells,
        least recently used first; then try smaller prefill chunks; then end the generation
        furthest past its fair share of the pool; then fail the newest request."""
        loaded = self.loaded
        if loaded.prefixes.evict_idle():
            return
        prefill = [e for e in entries if not e.is_decode]
        largest = max((e.n for e in prefill), default=0)
        if largest > MIN_CHUNK_ON_PRESSURE:
            self.chunk_cap = largest // 2  # fragmented cells may still fit a smaller chunk
            return
        greedy = longest_over_share(loaded.slots, loaded.ctx.n_ctx, self.config.n_parallel)
        if greedy is not None:  # see fairness.py
            log.info("slot %d: the KV pool is full; ending its generation at %d tokens, past its fair share", greedy.id, greedy.n_past)
            self.outbox.finish(greedy, FinishReason.LENGTH)
            return
        newest = max((e.slot for e in entries), key=lambda s: s.active.admitted)
        log.warning("slot %d: the KV pool is full; failing request %s", newest.id, newest.active.req.id)
        self.outbox.finish(newest, FinishReason.STOP, EngineError(
            ErrorKind.BUSY, "the KV cache is full with other requests; retry later or raise --ctx-size"
        ))
        loaded.memory.clear(newest)

    def _on_decode_error(self, entries: list[BatchEntry], rc: int) -> None:
        log.error("llama_decode failed with %d; failing %d requests", rc, len(entries))
        for entry in entries:
            slot = entry.slot
            if slot.active is not None:
                self.outbox.finish(slot, FinishReason.STOP, EngineError(ErrorKind.INTERNAL, f"llama_decode failed ({rc})"))
            # processed ubatches may remain in memory: start this sequence over
            self.loaded.memory.clear(slot)
