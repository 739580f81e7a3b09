"""The engine: one thread that owns the llama context and runs N slots.

Each step reads like this:

    inbox  -> admit waiting requests to slots (reusing what the slots hold)
    plan   -> one batch: a token for every decoding slot + bounded prefill chunks
    decode -> one llama_decode
    post   -> sample, stream text out, finish requests, take checkpoints

Nothing outside this thread touches the context. The HTTP side talks to the engine through
`submit`, `abort` and `call`, which only put messages into the inbox.
"""

from __future__ import annotations

import bisect
import collections
import concurrent.futures
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from warmslot.cache.prompt_cache import PromptCache

from .fairness import longest_over_share
from .lifecycle import Lifecycle, ShuttingDown
from .llama_api import Batch, Context, GrammarError, LlamaError, Model, Placement, Sampler
from .loader import load_parts
from .logprobs import token_logprob
from .parallel_sampling import BatchSampler
from .requests import EngineError, ErrorKind, Event, FinishReason, GenerateRequest, NotReady, QueueFull, Rejected, Reuse, Usage
from .router import Fetch, Fork, Route, Wait
from .scheduler import BatchEntry, plan_batch, timed_prefill_cap
from .slot import Active, Slot
from .snapshot import EngineInfo, EngineSnapshot, take_snapshot
from .stats import EngineStats
from .text import TextStream
from .vocab import Vocab

log = logging.getLogger("warmslot.engine")


@dataclass(slots=True)
class EngineConfig:
    model_path: str
    n_parallel: int = 4
    n_ctx: int = 0  # cells of all slots; 0: the training context if it fits the memory (context_size.py)
    n_batch: int = 2048
    n_ubatch: int = 512
    n_threads: int = 0
    n_threads_batch: int = 0
    n_gpu_layers: int = -1
    flash_attn: str = "auto"
    type_k: str = "f16"
    type_v: str = "f16"
    swa_full: bool = False
    max_queue: int = 64
    prefill_chunk: int = 0  # prefill tokens per step while other slots decode; 0: n_ubatch
    ctx_checkpoints: int = 32  # per slot
    checkpoint_bytes: int = 4 << 30  # per slot
    checkpoint_every: int = 8192  # tokens between checkpoints inside one long prefill
    cache_ram: int = 8 << 30  # prompt cache budget in bytes; 0: no prompt cache
    park_idle: bool = True  # move idle slots to the prompt cache when a request starts (unified pool)
    kv_unified: str = "auto"  # on: one KV pool for all slots; off: a stream per slot; auto: see layout.kv_unified
    cache_vram: int | None = 0  # device memory for spare sequences (see layout.py); None: auto
    embeddings: bool = False  # a second context for embeddings (`embedder`)
    pooling: str = "auto"  # its pooling: auto (the model's), mean, cls, last
    cache_ram_auto: bool = False  # cache_ram was sized from the RAM (shown in the capacity table)
    use_mmap: bool = True
    use_mlock: bool = False
    cache_disk: str | None = None  # directory of the disk tier below the prompt cache; None: off
    cache_disk_size: int = 0  # its budget in bytes
    placement: Placement = Placement()  # split mode, tensor split, devices, RPC servers


MIN_CHUNK_ON_PRESSURE = 32  # below this, a prefill that does not fit fails its request


class Engine(Lifecycle):
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.stats = EngineStats()
        self.model: Model | None = None
        self.info: EngineInfo | None = None  # published once the model is loaded
        self.vocab: Vocab | None = None  # the vocabulary, for any thread
        self.embedder = None  # with config.embeddings: embeddings on a context of their own, for any thread
        self._published: EngineSnapshot | None = None
        self.ctx: Context | None = None
        self.cache: PromptCache | None = None
        self.disk = None  # the disk tier (slots.disk_tier.DiskTier), when on
        self.slots: list[Slot] = []
        self.ready = threading.Event()
        self.load_error: BaseException | None = None
        self.load_progress = 0.0
        self._cv = threading.Condition()
        self._inbox: collections.deque[tuple[str, Any]] = collections.deque()
        self._waiting: collections.deque[GenerateRequest] = collections.deque()
        self._n_queued = 0  # submitted and not yet given a slot (inbox + waiting)
        self._aborts: set[str] = set()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._batch: Batch | None = None
        self.sampling: BatchSampler | None = None
        self._filler_budget = 0  # cells a micro-batch is worth (streams of attention memory); 0: no fillers
        self._chunk_cap = 0  # lowered after the KV pool could not fit a batch
        self._deferred: list[tuple[Slot, int, Any]] = []  # checkpoints to take after flushing
        self._pending_events: list[tuple[Any, list[Event]]] = []  # finished requests' events

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
        """Queue a request. Raises NotReady, QueueFull, or Rejected for a request that can
        never run."""
        if not self.ready.is_set() or self.load_error is not None:
            raise NotReady("the model is loading")
        error = self._check(req)
        if error is not None:
            self.stats.requests[error.kind.value] += 1
            raise Rejected(error)
        with self._cv:
            if self._draining:  # under the lock: drain() fails all that it queued before
                raise ShuttingDown("the server is shutting down")
            # requests that idle slots will take at the next step are not waiting (a read of
            # other threads' state: one step stale at worst, and conservative either way)
            idle = self.config.n_parallel - sum(1 for slot in self.slots if slot.active is not None)
            if self._n_queued - idle >= self.config.max_queue:
                self.stats.queue_rejected += 1
                raise QueueFull(f"{self._n_queued - idle} requests are waiting for a slot")
            self._n_queued += 1
            self._inbox.append(("submit", req))
            self._cv.notify()

    def abort(self, request_id: str) -> None:
        with self._cv:
            self._inbox.append(("abort", request_id))
            self._cv.notify()

    def call(self, fn: Callable[["Engine"], Any]) -> concurrent.futures.Future:
        """Run fn(engine) on the engine thread between steps; returns a Future of its result."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._cv:
            self._inbox.append(("call", (fn, fut)))
            self._cv.notify()
        return fut

    def snapshot(self, *, detail: bool = False, timeout: float = 10.0, visible: Callable[[str], bool] | None = None) -> EngineSnapshot | None:
        """The slots, queue and prompt cache. detail=False: the view published after the last
        step (any thread, no wait; None before the model is loaded). detail=True: a fresh one
        with every checkpoint and cache entry, taken on the engine thread between steps; only
        tenants for which `visible(tenant)` holds show their details (None: all)."""
        if not detail:
            return self._published
        return self.call(lambda engine: take_snapshot(engine, detail=True, visible=visible)).result(timeout)

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
        return self._n_queued

    def stop(self, timeout: float = 30.0) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout)

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
            while not self._stop:
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
                    self._finish(slot, FinishReason.STOP, error)
                except Exception:  # noqa: BLE001 - the request still hears that it failed
                    slot.active.req.sink.push([Event(error=error)])
                    slot.active = None
                self.memory.clear(slot)
        self._deferred.clear()
        self._flush()

    def _load(self) -> None:
        last = [-1]

        def progress(p: float) -> None:
            self.load_progress = p
            pct = int(p * 100)
            if pct >= last[0] + 10 or pct == 100:
                last[0] = pct
                log.info("loading model: %d%%", pct)

        parts = load_parts(self.config, self.stats, progress, wake=lambda fn: self.call(lambda engine: fn()))
        self.model, self.ctx, self.layout, self.cache = parts.model, parts.ctx, parts.layout, parts.cache
        self.slots, self.memory, self.router, self.prefixes = parts.slots, parts.memory, parts.router, parts.prefixes
        self._batch, self.sampling, self._filler_budget = parts.batch, parts.sampling, parts.filler_budget
        self.vocab, self.info, self.disk, self.embedder = parts.vocab, parts.info, parts.disk, parts.embedder
        self._publish()

    def _publish(self) -> None:
        """Replace the light snapshot that /metrics reads (one reference swap)."""
        self._published = take_snapshot(self, detail=False)

    def _shutdown(self) -> None:
        for slot in self.slots:
            if slot.active is not None:
                self._finish(slot, FinishReason.ABORT)
        self._flush()
        if self.disk is not None:
            self.disk.shutdown(self.slots, lambda seq: self.ctx.state_get(seq, partial=False))
        if self.sampling is not None:
            self.sampling.close()
        if self.ctx is not None:
            self.ctx.close()
        if self.embedder is not None:
            self.embedder.close()
        if self.model is not None:
            self.model.close()

    def _step(self) -> None:
        self._drain_inbox()
        if self._stop:
            return
        t0 = time.monotonic()
        self._reap_aborts()
        self._expire_deadlines()
        self._admit()
        entries = plan_batch(
            self.slots, self._batch, self._prefill_budget(),
            by_sequence=not self.ctx.unified, filler_budget=self._filler_budget,
        )
        if entries:
            self._run(entries)  # flushes the previous step's events once its decode is launched
        else:
            self._flush()
        if self.memory.fork_pending:
            self._settle_fork()
        self._take_deferred_checkpoints()
        if not self._has_work():
            self._flush()  # nothing will run next: do not hold events back
        self.stats.step_seconds += time.monotonic() - t0
        self._publish()

    def _has_work(self) -> bool:
        """Slots running, or requests that may be admitted (not those waiting for a disk read)."""
        return any(s.active is not None for s in self.slots) or any(
            self.disk is None or not self.disk.waiting(r.id) for r in self._waiting)

    def _drain_inbox(self) -> None:
        with self._cv:
            if not self._inbox and not self._stop and not self._has_work():
                self.ctx.host.idle(True)  # a good time to pin more host memory
                while not self._inbox and not self._stop and not self._has_work():
                    self._cv.wait()
                self.ctx.host.idle(False)
            messages = list(self._inbox)
            self._inbox.clear()
        for kind, payload in messages:
            if kind == "submit":
                self._waiting.append(payload)
            elif kind == "abort":
                self._aborts.add(payload)
            elif kind == "call":
                fn, fut = payload
                try:
                    fut.set_result(fn(self))
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    fut.set_exception(exc)

    def _reap_aborts(self) -> None:
        if not self._aborts:
            return
        for slot in self.slots:
            if slot.active is not None and slot.active.req.id in self._aborts:
                self._finish(slot, FinishReason.ABORT)
        kept = collections.deque()
        for req in self._waiting:
            if req.id in self._aborts:
                self._dequeued()
                req.sink.push([Event(finish=FinishReason.ABORT, usage=Usage(len(req.tokens), 0))])
            else:
                kept.append(req)
        self._waiting = kept
        self._aborts.clear()

    def _dequeued(self) -> None:
        with self._cv:
            self._n_queued -= 1

    # -- admission ---------------------------------------------------------------------

    def _admit(self) -> None:
        """Give waiting requests slots, in arrival order. A request that waits for another
        slot's prefill to pass their shared prefix lets later requests go first."""
        i = 0
        held: set[str] = set()  # passed over in this loop: their siblings wait behind them
        while i < len(self._waiting):
            req = self._waiting[i]
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
            del self._waiting[i]
            self._dequeued()
            self.stats.queue_wait.observe(time.monotonic() - req.submitted)
            try:
                self._start(route, req)
            except Exception as exc:  # noqa: BLE001 - one bad request must not stop the engine
                log.exception("slot %d: request %s failed to start", route.target.id, req.id)
                route.target.active = None
                self.memory.clear(route.target)
                self._reject(req, EngineError(ErrorKind.INTERNAL, f"internal error starting the request: {type(exc).__name__}: {exc}"))

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
            self._reject(req, EngineError(ErrorKind.INVALID, str(exc)))
            return
        try:
            reuse, plan = self.prefixes.take(route, req)
            self._activate(route.target, req, sampler, reuse)
        except BaseException:
            sampler.close()  # the request never became active
            raise
        if reuse.cached == len(req.tokens):
            self._prompt_done_from_logits(route.target, plan.logits)

    def _check(self, req: GenerateRequest) -> EngineError | None:
        """A request runs only if its prompt leaves a slot room for one generated token: the
        one place the context limit is checked for a prompt (generation stops at the same
        limit in `_on_token`). Reads only constants; safe on any thread."""
        n_prompt = len(req.tokens)
        if n_prompt >= self.ctx.n_ctx_seq:
            return EngineError(ErrorKind.CONTEXT, f"the prompt has {n_prompt} tokens; a slot holds {self.ctx.n_ctx_seq}")
        if min(req.tokens) < 0 or max(req.tokens) >= self.model.n_vocab:
            return EngineError(ErrorKind.INVALID, f"the prompt has token ids outside the vocabulary (0..{self.model.n_vocab - 1})")
        return None

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
        active.event().reuse = reuse
        log.debug("slot %d: request %s, %d prompt tokens, kept %d from %s (%s)", slot.id, req.id, len(req.tokens), keep, reuse.source, reuse.reason)

    def _reject(self, req: GenerateRequest, error: EngineError) -> None:
        self.stats.requests[error.kind.value] += 1
        req.sink.push([Event(error=error)])

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
        rc = self.ctx.decode(self._batch)
        t1 = time.monotonic()
        self.stats.decode_call_seconds += t1 - t0
        self.memory.fork_pending = False  # llama_decode performs pending stream copies first
        if rc != 0:
            for entry in entries:
                if entry.filler:
                    self.ctx.seq_rm(entry.slot.id, entry.start, -1)
            entries = [e for e in entries if not e.filler]
        if rc == 1:
            self._on_kv_full(entries)
            return
        if rc != 0:
            self._on_decode_error(entries, rc)
            return
        # the decode runs asynchronously on a GPU: hand the previous step's events to the
        # HTTP side now, so streaming them overlaps the computation instead of delaying it
        self._flush()
        self._chunk_cap = 0
        t2 = time.monotonic()
        self.ctx.synchronize()
        self.stats.device_wait_seconds += time.monotonic() - t2
        n_decode = sum(1 for e in entries if e.is_decode)
        n_filler = sum(1 for e in entries if e.filler)
        to_sample: list[BatchEntry] = []
        for entry in entries:
            slot = entry.slot
            if entry.filler:
                self.ctx.seq_rm(slot.id, entry.start, -1)
                continue
            if slot.active is None:
                continue
            if entry.is_decode:
                slot.tokens.append(slot.active.pending)
                slot.active.pending = None
                to_sample.append(entry)
            elif self._after_prefill(slot, entry):
                to_sample.append(entry)
        tokens = self.sampling.sample([(e.slot.active.sampler, e.out_index) for e in to_sample])
        for entry, token in zip(to_sample, tokens):
            self._on_token(entry.slot, token, entry.out_index)
        self.stats.filler_tokens += n_filler
        self.stats.record_step(self._batch.n - n_decode - n_filler, n_decode, time.monotonic() - t0)

    def _settle_fork(self) -> None:
        """A fork between streams is copied by llama.cpp at the next decode, and no decode
        ran after it (its request finished or left at once). Run a one-token decode into the
        target so the copy happens before anything writes either sequence, then cut the
        token (or, on memory that cannot be cut, drop the target's contents)."""
        target = self.memory.fork_target
        pos = target.n_past
        self._batch.clear()
        self._batch.add((self.model.bos if self.model.bos >= 0 else 0,), pos, target.id, logits_last=False)
        rc = self.ctx.decode(self._batch)
        self.memory.fork_pending = False
        if rc != 0 or not self.ctx.seq_rm(target.id, pos, -1):
            self.memory.clear(target)

    def _after_prefill(self, slot: Slot, entry: BatchEntry) -> bool:
        """Account a prefill chunk. True when the prompt is complete and a token is to be
        sampled from the chunk's last logits."""
        active = slot.active
        slot.tokens.extend(active.prompt[entry.start : entry.start + entry.n])
        n = slot.n_past
        if n < len(active.prompt):
            if active.cuts and active.cuts[0] == n:
                active.cuts.pop(0)
                self._deferred.append((slot, n, None))
            return False
        # the prompt is in memory: its last token's logits are at out_index
        logits = self.ctx.logits(entry.out_index)
        if active.req.return_prompt_logits:
            active.event().prompt_logits = logits
        self._deferred.append((slot, n, logits))
        active.prefill_done = True
        if active.req.max_tokens == 0:
            self._finish(slot, FinishReason.LENGTH)
            return False
        return True

    def _prompt_done_from_logits(self, slot: Slot, logits) -> None:
        """The whole prompt was reused with its saved last-token logits: sample from those."""
        active = slot.active
        self.stats.logits_reused += 1
        if active.req.return_prompt_logits:
            active.event().prompt_logits = logits.copy()
        active.prefill_done = True
        if active.req.max_tokens == 0:
            self._finish(slot, FinishReason.LENGTH)
            return
        self._on_token(slot, active.sampler.sample_logits(logits), logits)

    def _on_token(self, slot: Slot, token: int, row) -> None:
        """A sampled token; `row` is the batch output it was sampled from, or saved logits."""
        active = slot.active
        now = time.monotonic()
        if not active.generated:
            active.first_token_at = now
            self.stats.ttft.observe(now - active.req.submitted)
        else:
            self.stats.itl.observe(now - active.last_token_at)
        active.last_token_at = now
        active.generated.append(token)
        event = active.event()
        if self.model.is_eog(token) and not active.req.ignore_eos:
            self._finish(slot, FinishReason.STOP)
            return
        event.tokens.append(token)
        if active.req.logprobs is not None:
            logits = self.ctx.logits(row) if isinstance(row, int) else row
            event.logprobs.append(token_logprob(logits, active.req.sampling.logit_bias, token, active.req.logprobs))
        event.text += active.text.feed(self.model.token_piece(token, special=False))
        if active.text.stopped_by is not None:
            self._finish(slot, FinishReason.STOP)
        elif self._out_of_room(active, slot):
            self._finish(slot, FinishReason.LENGTH)
        else:
            active.pending = token

    def _out_of_room(self, active: Active, slot: Slot) -> bool:
        """max_tokens reached, or the next token would not fit the slot's context."""
        limit = active.req.max_tokens
        return (limit is not None and len(active.generated) >= limit) or slot.n_past + 1 >= self.ctx.n_ctx_seq

    def _finish(self, slot: Slot, reason: FinishReason, error: EngineError | None = None) -> None:
        active = slot.active
        event = active.event()
        if error is None and reason is not FinishReason.ABORT:
            event.text += active.text.finish()
        now = time.monotonic()
        n_prompt = len(active.prompt)
        reuse = active.reuse
        usage = Usage(
            prompt_tokens=n_prompt,
            cached_tokens=reuse.cached,
            completion_tokens=len(active.generated),
            source=reuse.source,
            queue_s=active.admitted - active.req.submitted,
            prefill_s=(active.first_token_at or now) - active.admitted,
            decode_s=now - active.first_token_at if active.first_token_at else 0.0,
            ttft_s=(active.first_token_at - active.req.submitted) if active.first_token_at else 0.0,
        )
        event.usage = usage
        if error is not None:
            event.error = error
            self.stats.requests[error.kind.value] += 1
        else:
            event.finish = reason
            self.stats.requests[reason.value] += 1
        self.stats.add_prompt(reuse.source.value, reuse.cached, usage.computed_tokens)
        self.stats.generated_tokens += len(active.generated)
        active.sampler.close()
        slot.last_used = now
        self._pending_events.append((active.req.sink, active.events))
        slot.active = None

    def _flush(self) -> None:
        """Hand this step's events to their sinks: one push per request per step."""
        for slot in self.slots:
            active = slot.active
            if active is not None and active.events:
                self._pending_events.append((active.req.sink, active.events))
                active.events = []
        for sink, events in self._pending_events:
            try:
                sink.push(events)
            except Exception:  # noqa: BLE001 - a broken sink must not stop the engine
                log.exception("a request's sink failed")
        self._pending_events.clear()

    def _take_deferred_checkpoints(self) -> None:
        for slot, n, logits in self._deferred:
            # no decode ran since the deferral, so the memory still ends at n (unless the
            # request failed and its slot was cleared)
            if slot.n_past == n:
                self.memory.checkpoint(slot, n, logits)
        self._deferred.clear()

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
            self._finish(greedy, FinishReason.LENGTH)
            return
        newest = max((e.slot for e in entries), key=lambda s: s.active.admitted)
        log.warning("slot %d: the KV pool is full; failing request %s", newest.id, newest.active.req.id)
        self._finish(newest, FinishReason.STOP, EngineError(
            ErrorKind.BUSY, "the KV cache is full with other requests; retry later or raise --ctx-size"
        ))
        self.memory.clear(newest)

    def _on_decode_error(self, entries: list[BatchEntry], rc: int) -> None:
        log.error("llama_decode failed with %d; failing %d requests", rc, len(entries))
        for entry in entries:
            slot = entry.slot
            if slot.active is not None:
                self._finish(slot, FinishReason.STOP, EngineError(ErrorKind.INTERNAL, f"llama_decode failed ({rc})"))
            # processed ubatches may remain in memory: start this sequence over
            self.memory.clear(slot)
