"""The engine: one thread that owns the llama context and runs N slots.

Each step reads like this:

    inbox  -> admit waiting requests to slots (reusing what the slots hold)
    plan   -> one batch: a token for every decoding slot + bounded prefill chunks
    decode -> one llama_decode
    post   -> sample, stream text out, finish requests, take checkpoints

Nothing outside this thread touches the context. The HTTP side talks to the engine through
`submit`, `abort` and `call`, which only put messages into the inbox.

Its collaborators, each in its own module: `Admission` (the inbox and the requests waiting
for a slot, queue limits, rejections), `Postprocess` (the token path after a decode),
`Outbox` (events back to the requests, the end of a request), `Lifecycle` (deadlines and
draining, through the `Running` contract), and the parts `load_parts` builds once the model
is loaded: `router` (where a prompt comes from), `prefixes` (applies that), `memory` (moves
sequence state) and `layout` (the KV layout).
"""

from __future__ import annotations

import bisect
import concurrent.futures
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from warmslot.cache.prompt_cache import PromptCache

from .admission import Admission, PromptLimits
from .settings import EngineConfig
from .disk_tier import DiskTier
from .embedding_worker import Embedder, Reranker
from .fairness import longest_over_share
from .fitting.layout import KvLayout
from .lifecycle import Lifecycle
from .llama_api import Batch, Context, GrammarError, LlamaError, MemoryKind, Model, Sampler
from .loader import load_parts
from .multimodal.prefill import MediaPrefill
from .memory import SlotMemory
from .outbox import Outbox
from .postprocess import Postprocess
from .parallel_sampling import BatchSampler
from .prefix import Prefixes
from .requests import EngineError, ErrorKind, Event, FinishReason, GenerateRequest, NotReady, Reuse
from .router import Fetch, Fork, Route, Router, Wait
from .scheduler import BatchEntry, plan_batch, timed_prefill_cap
from .slot import Active, Slot
from .snapshot import EngineInfo, EngineSnapshot, take_snapshot
from .speculation.draft_model import load_draft
from .speculation.speculator import Speculator
from .stats import CopyCause, EngineStats
from .text import TextStream
from .vocab import Vocab

__all__ = ["Engine", "EngineConfig"]

log = logging.getLogger("warmslot.engine")


MIN_CHUNK_ON_PRESSURE = 32  # below this, a prefill that does not fit fails its request


@dataclass(frozen=True, slots=True)
class _Asleep:
    """The context's facts a snapshot shows while the model is unloaded."""

    memory_kind: MemoryKind
    n_ctx: int
    host: Any  # the host buffers the prompt cache's entries live in


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.stats = EngineStats()
        self.ready = threading.Event()
        self.load_error: BaseException | None = None
        self.load_progress = 0.0
        # published once the model is loaded, for any thread
        self.info: EngineInfo | None = None
        self.vocab: Vocab | None = None
        self.embedder: Embedder | None = None  # with config.embeddings: embeddings on a context of their own
        self.reranker: Reranker | None = None  # with config.reranking: relevance scores, likewise
        self._published: EngineSnapshot | None = None
        # the engine thread's parts, built by `load_parts` once the model is loaded
        self.model: Model | None = None
        self.ctx: Context | None = None
        self.layout: KvLayout | None = None
        self.slots: list[Slot] = []
        self.cache: PromptCache | None = None
        self.disk: DiskTier | None = None  # the disk tier, when on
        self.memory: SlotMemory | None = None  # saves, loads, forks and clears slots' sequences
        self.router: Router | None = None  # decides where a request's prompt comes from
        self.prefixes: Prefixes | None = None  # applies that decision
        self.sampling: BatchSampler | None = None
        self.post: Postprocess | None = None  # the token path after each decode
        self.media: MediaPrefill | None = None  # --mmproj: images in prompts
        self.projector = None  # --mmproj: its `tokenize_media` may be called from any thread
        self.spec: Speculator | None = None  # drafts tokens and verifies them (speculative decoding)
        self._batch: Batch | None = None
        self._filler_budget = 0  # cells a micro-batch is worth (streams of attention memory); 0: no fillers
        self._chunk_cap = 0  # lowered after the KV pool could not fit a batch
        self._thread: threading.Thread | None = None
        self._asleep: _Asleep | None = None  # what the snapshot needs while the model is unloaded
        self._reload: EngineConfig | None = None  # loads the same parts again (waking from sleep)
        # collaborators: the queue in front of the slots, the events back to the requests,
        # and deadlines and draining
        self.admission = Admission(self.stats, config.max_queue, config.n_parallel)
        self.outbox = Outbox(self.stats)
        self.lifecycle = Lifecycle(self, self.admission)

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
    def started(self) -> bool:
        return self._thread is not None

    @property
    def queue_depth(self) -> int:
        return self.admission.n_queued

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

    # -- the engine thread -------------------------------------------------------------

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

    def _take_snapshot(self, *, detail: bool, visible: Callable[[str], bool] | None = None) -> EngineSnapshot:
        return take_snapshot(
            self.slots, self.cache, self.ctx or self._asleep, self.queue_depth, detail=detail, visible=visible, stats=self.stats,
        )

    # -- sleep (--sleep-idle-seconds) ----------------------------------------------------

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
                self.memory.save(slot, CopyCause.SLEEP)
                parked += 1
        self._asleep = _Asleep(self.ctx.memory_kind, self.ctx.n_ctx, self.ctx.host)
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

    def _publish(self) -> None:
        """Replace the light snapshot that /metrics reads (one reference swap)."""
        self._published = self._take_snapshot(detail=False)

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
        self._publish()

    def _run_call(self, call: tuple[Callable[["Engine"], Any], concurrent.futures.Future]) -> None:
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

    # -- admission ---------------------------------------------------------------------

    def _admit(self) -> None:
        """Give waiting requests slots, in arrival order. A request that waits for another
        slot's prefill to pass their shared prefix lets later requests go first."""
        i = 0
        held: set[str] = set()  # passed over in this loop: their siblings wait behind them
        waiting = self.admission.waiting
        while i < len(waiting):
            req = waiting[i]
            route = Wait(None) if req.sibling_of in held else self.router.route(req)
            if isinstance(route, Fetch):  # read from disk first; its siblings wait behind it
                self.disk.fetch(route.entry, req.id, route.need)
                held.add(req.id)
                i += 1
                continue
            # NOTE: a fork between streams is pending until the next decode; more forks of the
            # same donor may join it (llama.cpp performs every pending copy then), nothing else
            if self.memory.fork_pending and not (isinstance(route, Fork) and route.donor is self.memory.fork_donor):
                return
            if isinstance(route, Wait):
                if route.for_slot is None and req.sibling_of not in held:
                    return  # no idle slot
                if route.for_slot is not None:
                    self._want_checkpoint(route.for_slot, route.shared)
                held.add(req.id)
                i += 1
                continue
            self.admission.admitted(i)
            self.stats.queue_wait.observe(time.monotonic() - req.submitted)
            try:
                self._start(route, req)
            except Exception as exc:  # noqa: BLE001 - one bad request must not stop the engine
                log.exception("slot %d: request %s failed to start", route.target.id, req.id)
                route.target.active = None
                self.memory.clear(route.target)
                self.admission.reject(req, EngineError(ErrorKind.INTERNAL, f"internal error starting the request: {type(exc).__name__}: {exc}"))

    def _want_checkpoint(self, slot: Slot, n: int) -> None:
        """Ask a prefilling slot to stop at n (and checkpoint there) for a request waiting to
        share its first n tokens. Attention memory can be forked at any position."""
        active = slot.active
        if not self.ctx.memory_kind.truncatable and n > slot.n_past and n not in active.cuts:
            bisect.insort(active.cuts, n)

    def _start(self, route: Route, req: GenerateRequest) -> None:
        try:
            sampler = Sampler(self.model, req.sampling)
        except GrammarError as exc:
            self.admission.reject(req, EngineError(ErrorKind.INVALID, str(exc)))
            return
        try:
            reuse, plan = self.prefixes.take(route, req)
            self._activate(route.target, req, sampler, reuse)
        except BaseException:
            sampler.close()  # the request never became active
            raise
        if reuse.cached == len(req.tokens):
            self.post.prompt_done_from_logits(route.target, plan.logits)

    def _activate(self, slot: Slot, req: GenerateRequest, sampler: Sampler, reuse: Reuse) -> None:
        keep = reuse.cached
        active = Active(
            req=req,
            sampler=sampler,
            text=TextStream(req.stop),
            reuse=reuse,
            cuts=self.prefixes.cuts(req, keep),
        )
        slot.active = active
        slot.tenant = req.tenant
        slot.prompt_end = len(req.tokens)
        slot.last_used = time.monotonic()
        self.prefixes.park_idle(keep=slot)
        active.event().started = True
        active.event().admitted_at = active.admitted
        active.event().reuse = reuse
        active.report_progress(keep, at_start=True)
        log.debug("slot %d: request %s, %d prompt tokens, kept %d from %s (%s)", slot.id, req.id, len(req.tokens), keep, reuse.source, reuse.reason)

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
