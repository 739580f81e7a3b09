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

import array
import bisect
import collections
import concurrent.futures
import hashlib
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from warmslot.cache.checkpoints import CheckpointList
from warmslot.cache.prompt_cache import PromptCache

from .layout import KvLayout, plan_layout
from .llama_api import (
    Batch, Context, ContextParams, GrammarError, LlamaError, MemoryKind, Model, Sampler, classify_memory, supports_gpu_offload,
)
from .parallel_sampling import BatchSampler, sampling_threads
from .requests import (
    EngineError,
    ErrorKind,
    Event,
    FinishReason,
    GenerateRequest,
    Reuse,
    Source,
    Usage,
)
from .memory import SlotMemory
from .reuse import ReusePlan
from .router import Fork, Fresh, KeepSlot, Load, Route, Router, Wait
from .scheduler import BatchEntry, plan_batch
from .slot import Active, Slot
from .stats import CopyCause, EngineStats
from .text import TextStream

log = logging.getLogger("warmslot.engine")


class QueueFull(Exception):
    """The waiting queue is at --max-queue."""


class NotReady(Exception):
    """The model is still loading (or failed to load)."""


class Rejected(Exception):
    """The request can never run (a prompt that does not fit a slot, token ids outside the
    vocabulary); `error` says why."""

    def __init__(self, error: EngineError) -> None:
        super().__init__(error.message)
        self.error = error


@dataclass(slots=True)
class EngineConfig:
    model_path: str
    n_parallel: int = 4
    n_ctx: int = 0  # 0: the model's training context, capped at DEFAULT_MAX_CTX
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


MIN_CHUNK_ON_PRESSURE = 32  # below this, a prefill that does not fit fails its request
# a request that shares all but this many tokens of a slot's previous prompt continues that
# conversation: the slot's contents are not worth a copy in the prompt cache
SAVE_MIN_LOSS = 32
PINNED_AT_START = 16 << 30  # pinned host memory prepared while the model loads (CUDA only)


def physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 16 << 30


def content_hash(tokens: list[int]) -> str:
    """A short hash of a token list (equal contents, equal hash)."""
    return hashlib.blake2b(array.array("i", tokens).tobytes(), digest_size=6).hexdigest() if tokens else ""


def tenant_hash(tenant: str) -> str:
    return hashlib.blake2b(tenant.encode(), digest_size=4).hexdigest() if tenant else ""


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.stats = EngineStats()
        self.model: Model | None = None
        self.ctx: Context | None = None
        self.cache: PromptCache | None = None
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

    def snapshot(self, timeout: float = 10.0) -> dict[str, Any]:
        """A consistent view of the slots, taken on the engine thread between steps."""
        return self.call(lambda engine: engine._describe()).result(timeout)

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

    def _describe(self) -> dict[str, Any]:
        slots = []
        for slot in self.slots:
            active = slot.active
            slots.append({
                "id": slot.id,
                "state": slot.state.value,
                "n_tokens": slot.n_past,
                "content_hash": content_hash(slot.tokens),
                "tenant": tenant_hash(slot.tenant),
                "checkpoints": [
                    {"n_tokens": c.n_tokens, "bytes": c.nbytes, "logits": c.logits is not None}
                    for c in slot.checkpoints
                ],
                "checkpoint_bytes": slot.checkpoints.nbytes,
                "idle_s": round(time.monotonic() - slot.last_used, 3) if slot.last_used and active is None else 0.0,
                "request": None if active is None else {
                    "id": active.req.id,
                    "n_prompt": len(active.prompt),
                    "n_cached": active.reuse.cached,
                    "n_generated": len(active.generated),
                },
            })
        return {
            "memory": self.ctx.memory_kind.value,
            "n_ctx": self.ctx.n_ctx,
            "slots": slots,
            "queue_depth": self._n_queued,
            "cache": self._describe_cache(),
        }

    def _describe_cache(self) -> dict[str, Any] | None:
        cache = self.cache
        if cache is None:
            return None
        now = time.monotonic()
        return {
            "budget_bytes": cache.budget,
            "bytes": cache.nbytes,
            "entries": [
                {
                    "n_tokens": len(e),
                    "bytes": e.nbytes,
                    "idle_s": round(now - e.last_used, 3),
                    "tenant": tenant_hash(e.tenant),
                    "content_hash": content_hash(list(e.tokens)),
                    "checkpoints": [c.n_tokens for c in e.checkpoints],
                }
                for e in reversed(list(cache.entries()))  # most recently used first
            ],
        }

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
        cfg = self.config
        last = [-1]

        def progress(p: float) -> None:
            self.load_progress = p
            pct = int(p * 100)
            if pct >= last[0] + 10 or pct == 100:
                last[0] = pct
                log.info("loading model: %d%%", pct)

        log.info("loading %s", cfg.model_path)
        self.model = Model(cfg.model_path, n_gpu_layers=cfg.n_gpu_layers, progress=progress)
        info = self.model.info
        layout = plan_layout(
            self.model, classify_memory(info, cfg.swa_full), n_parallel=cfg.n_parallel, n_ctx=cfg.n_ctx,
            kv_unified_setting=cfg.kv_unified, cache_vram=cfg.cache_vram, type_k=cfg.type_k, type_v=cfg.type_v,
            on_gpu=cfg.n_gpu_layers != 0 and supports_gpu_offload(),
        )
        self.layout = layout
        unified = layout.unified
        params = ContextParams(
            n_ctx=layout.n_ctx,
            n_batch=max(cfg.n_batch, layout.n_seq),
            n_ubatch=cfg.n_ubatch,
            n_seq_max=layout.n_seq,
            n_threads=cfg.n_threads,
            n_threads_batch=cfg.n_threads_batch,
            flash_attn=cfg.flash_attn,
            type_k=cfg.type_k,
            type_v=cfg.type_v,
            swa_full=cfg.swa_full,
            kv_unified=unified,
            pinned_states=cfg.n_gpu_layers != 0,
            # the prompt cache, every slot's checkpoints and some slack; never most of the RAM
            pinned_limit=min(cfg.cache_ram + cfg.n_parallel * cfg.checkpoint_bytes + (2 << 30), physical_memory() * 3 // 4),
        )
        self.ctx = Context(self.model, params)
        self._batch = Batch(self.ctx.n_batch, self.ctx.n_seq_max)
        self.sampling = BatchSampler(self.ctx, sampling_threads(cfg.n_parallel))
        host = self.ctx.host
        if host.pinned:
            host.prepare(initial=min(PINNED_AT_START, cfg.cache_ram + (1 << 30)))
            log.info("pinned %.1f GiB of host memory for states in %.1f s", host.allocated_bytes / (1 << 30), host.pinning_seconds)
        self.slots = [
            Slot(i, CheckpointList(cfg.ctx_checkpoints, cfg.checkpoint_bytes)) for i in range(layout.n_seq)
        ]
        kind = self.ctx.memory_kind
        # a saved state records the KV layout (one pool, or its stream count)
        fingerprint = f"{info.fingerprint}:{cfg.type_k}:{cfg.type_v}:{int(cfg.swa_full)}:{'u' if unified else layout.n_seq}"
        self.cache = PromptCache(cfg.cache_ram, fingerprint, kind.truncatable) if cfg.cache_ram > 0 else None
        self.memory = SlotMemory(self.ctx, self.model, self.cache, self.stats)
        # NOTE: a fork between streams is copied at the next decode, after a sliding-window
        # checkpoint restore into the target would already have been written: no forks there
        can_fork = unified or kind is not MemoryKind.SWA
        per_token = self.model.kv_bytes_per_token(cfg.type_k, cfg.type_v)
        if not unified and kind is MemoryKind.ATTENTION and per_token:
            self._filler_budget = info.size_bytes // per_token
        self.router = Router(self.slots, self.cache, self.memory.cutter, kind.truncatable, can_fork, n_busy_max=cfg.n_parallel, contiguous=not unified)
        log.info(
            "model %s (%s, %s memory%s): %d slots, context %d tokens %s%s, batch %d/%d, %d threads",
            info.name,
            info.arch,
            self.ctx.memory_kind.value,
            f", window {info.n_swa}" if self.ctx.memory_kind is MemoryKind.SWA else "",
            cfg.n_parallel,
            self.ctx.n_ctx,
            f"in one pool (up to {self.ctx.n_ctx_seq} per slot)" if unified else f"as a stream of {self.ctx.n_ctx_seq} per slot",
            f", {layout.n_spare} spare streams keep idle conversations on the device" if layout.n_spare else "",
            self.ctx.n_batch,
            self.ctx.n_ubatch,
            self.ctx.n_threads,
        )

    def _shutdown(self) -> None:
        for slot in self.slots:
            if slot.active is not None:
                self._finish(slot, FinishReason.ABORT)
        self._flush()
        if self.sampling is not None:
            self.sampling.close()
        if self.ctx is not None:
            self.ctx.close()
        if self.model is not None:
            self.model.close()

    def _step(self) -> None:
        self._drain_inbox()
        if self._stop:
            return
        t0 = time.monotonic()
        self._reap_aborts()
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

    def _has_work(self) -> bool:
        return bool(self._waiting) or any(s.active is not None for s in self.slots)

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
        while i < len(self._waiting) and not self.memory.fork_pending:
            req = self._waiting[i]
            route = self.router.route(req)
            if isinstance(route, Wait):
                if route.for_slot is None:
                    return  # no idle slot
                self._want_checkpoint(route.for_slot, route.shared)
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
            reuse, plan = self._reuse(route, req)
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

    def _reuse(self, route: Route, req: GenerateRequest) -> tuple[Reuse, ReusePlan | None]:
        """Bring the route's prefix into the target slot, and say what happened."""
        best = route.seen
        reuse = Reuse(slot=route.target.id, matched=best.matched if best else 0)
        if best is not None:
            reuse.candidate_source = best.source
            reuse.candidate_len = len(best.tokens)
            # described before the prefix is taken, which may cut the candidate's tokens
            if best.matched < min(len(best.tokens), len(req.tokens)):
                self._describe_divergence(reuse, best.tokens, req.tokens, best.matched)
        keep, plan = self._take_prefix(route, req)
        reuse.source = route.source if keep else Source.NONE
        reuse.cached = keep
        if plan is not None and keep:
            reuse.restored_checkpoint = plan.restore.n_tokens if plan.restore is not None else None
            reuse.used_logits = plan.logits is not None and keep == len(req.tokens)
            reuse.reason = plan.reason
        else:
            reuse.reason = best.reason if best else ""
        if reuse.matched > 0 and keep == 0:
            self.stats.full_prefills += 1
        return reuse, plan

    def _activate(self, slot: Slot, req: GenerateRequest, sampler: Sampler, reuse: Reuse) -> None:
        keep = reuse.cached
        active = Active(
            req=req,
            sampler=sampler,
            text=TextStream(req.stop),
            reuse=reuse,
            cuts=self._cuts(req, keep),
        )
        slot.active = active
        slot.tenant = req.tenant
        slot.prompt_end = len(req.tokens)
        slot.last_used = time.monotonic()
        self._park_idle(keep=slot)
        active.event().started = True
        active.event().reuse = reuse
        log.debug("slot %d: request %s, %d prompt tokens, kept %d from %s (%s)", slot.id, req.id, len(req.tokens), keep, reuse.source, reuse.reason)

    def _park_idle(self, keep: Slot) -> None:
        """Move the other idle slots' contents to the prompt cache and free their cells.

        NOTE: with a unified KV pool, attention runs over every cell up to the highest one in
        use, so cells that idle slots keep make every running request's decode slower (by
        about a third for one stream next to three idle 16K contexts). An idle slot's contents
        come back from RAM when they are needed again. With spare sequences (recurrent and
        hybrid models on a GPU, whose few attention layers make that cost small) idle
        conversations stay where they are instead."""
        if self.cache is None or not self.config.park_idle or not self.ctx.unified or self.layout.n_spare:
            return
        for slot in self.slots:
            if slot is keep or slot.active is not None or not slot.tokens:
                continue
            self.memory.save(slot, CopyCause.PARK)
            self.memory.clear(slot)
            self.stats.parked += 1

    def _describe_divergence(self, reuse: Reuse, old: list[int], new: list[int], at: int, width: int = 12) -> None:
        def text(tokens) -> str:
            return self.model.detokenize(tokens, special=True)

        reuse.context_text = text(new[max(0, at - width) : at])
        reuse.old_text = text(old[at : at + width])
        reuse.new_text = text(new[at : at + width])

    def _take_prefix(self, route: Route, req: GenerateRequest) -> tuple[int, ReusePlan | None]:
        """Fill the target slot with the route's source, cut back to what the prompt shares.

        The slot's previous contents go into the prompt cache first when the request goes
        elsewhere: when it diverges well before the end of the slot's previous prompt (a
        conversation that only re-renders the tail of the last turn does not pay for a save)."""
        slot, memory = route.target, self.memory
        if isinstance(route, Load):
            self.cache.touch(route.entry)  # most recently used: the save below cannot evict it
        if isinstance(route, KeepSlot):
            plan = route.plan  # the router's plan: nothing changed the slot since
            if plan.matched < slot.prompt_end - SAVE_MIN_LOSS:
                memory.save(slot, CopyCause.OVERWRITE)
            return memory.apply(slot, plan), plan
        if slot.tokens:
            memory.save(slot, CopyCause.OVERWRITE)
        if isinstance(route, Fork):
            memory.fork(route.donor, slot, route.usable)
        elif isinstance(route, Load):
            # cells the slots hold (an overestimate when slots share a prefix) plus the entry's
            while sum(s.n_past for s in self.slots) + len(route.entry) > self.ctx.n_ctx and self._evict_idle(exclude=slot):
                pass
            while not memory.load(route.entry, slot):
                if not self._evict_idle(exclude=slot):
                    return 0, None
            self.cache.stats.hits += 1
        else:
            memory.clear(slot)
            if self.cache is not None:
                self.cache.stats.misses += 1
            return 0, None
        plan = memory.plan(slot, req.tokens)
        return memory.apply(slot, plan), plan

    def _cuts(self, req: GenerateRequest, keep: int) -> list[int]:
        """Prompt positions (after keep, before the end) where a checkpoint is taken."""
        if self.ctx.memory_kind.truncatable:
            return []
        n = len(req.tokens)
        every = self.config.checkpoint_every
        cuts = {b for b in req.boundaries if keep < b < n}
        if every > 0:
            first = (keep // every + 1) * every
            cuts.update(range(first, n, every))
        return sorted(cuts)

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
        return cap

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
            self._on_token(entry.slot, token)
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
        self._on_token(slot, active.sampler.sample_logits(logits))

    def _on_token(self, slot: Slot, token: int) -> None:
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

    def _evict_idle(self, exclude: Slot | None = None) -> bool:
        """Make room in the KV pool: move the least recently used idle slot's contents to
        the prompt cache and clear it. False when no idle slot holds anything."""
        if not self.ctx.unified:
            return False  # each slot has a stream of its own: clearing another frees nothing
        idle = [s for s in self.slots if s.active is None and s.tokens and s is not exclude]
        if not idle:
            return False
        victim = min(idle, key=lambda s: s.last_used)
        log.info("slot %d: KV pool full; moving this idle slot's %d tokens to the prompt cache", victim.id, victim.n_past)
        self.memory.save(victim, CopyCause.SPILL)
        self.memory.clear(victim)
        self.stats.kv_evictions += 1
        return True

    def _on_kv_full(self, entries: list[BatchEntry]) -> None:
        """No room in the KV pool for this batch (memory is unchanged). Free idle slots' cells,
        least recently used first; then try smaller prefill chunks; then fail the newest request."""
        if self._evict_idle():
            return
        prefill = [e for e in entries if not e.is_decode]
        largest = max((e.n for e in prefill), default=0)
        if largest > MIN_CHUNK_ON_PRESSURE:
            self._chunk_cap = largest // 2  # fragmented cells may still fit a smaller chunk
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
