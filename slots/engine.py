"""The engine: one thread that owns the llama context and runs N slots.

Each step reads like this:

    inbox  -> admit waiting requests to slots (reusing what the slots hold)
    plan   -> one batch: a token for every decoding slot + bounded prefill chunks
    decode -> one llama_decode
    post   -> sample, stream text out, finish requests, take checkpoints

Nothing outside this thread touches the context. The HTTP side talks to the engine through
`submit`, `abort` and `call`, which only put messages into the inbox.

`Engine` holds the parts and the API any thread may call; what its thread does is in one
module per concern, each a class `Engine` is made of:

- `engine_thread.EngineThread`: the thread's life: load the model and install its parts,
  run steps until stopped, recover from a step that failed, shut down;
- `engine_step.EngineStep`: one step (the inbox, aborts, deadlines, the plan, its decode,
  what follows it) and what it does when the KV pool is full or the decode fails;
- `engine_admit.EngineAdmit`: waiting requests given slots: routed, their prefix applied,
  the slot activated;
- `engine_sleep.EngineSleep`: --sleep-idle-seconds: the model unloaded and loaded again;
- `engine_views.EngineViews`: what the HTTP side reads: snapshots, cache and disk counters.

Its collaborators, each in its own module: `Admission` (the inbox and the requests waiting
for a slot, queue limits, rejections), `Postprocess` (the token path after a decode),
`Outbox` (events back to the requests, the end of a request), `Lifecycle` (deadlines and
draining, through the `Running` contract), and the parts `load_parts` builds once the model
is loaded: `router` (where a prompt comes from), `prefixes` (applies that), `memory` (moves
sequence state) and `layout` (the KV layout).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from typing import Any, Callable, Iterator

from warmslot.cache.prompt_cache import PromptCache

from .admission import Admission
from .settings import EngineConfig
from .tiers.disk import DiskTier
from .embedding_worker import Embedder, Reranker
from .engine_admit import EngineAdmit
from .engine_sleep import EngineSleep, UnloadedContext
from .engine_step import EngineStep
from .engine_thread import EngineThread
from .engine_views import EngineViews
from .fitting.layout import KvLayout
from .lifecycle import Lifecycle
from .llama_api import Batch, Context, Model
from .multimodal.prefill import MediaPrefill
from .memory import SlotMemory
from .outbox import Outbox
from .postprocess import Postprocess
from .parallel_sampling import BatchSampler
from .prefix import Prefixes
from .requests import EngineError, FinishReason, GenerateRequest, NotReady
from .router import Router
from .slot import Slot
from .snapshot import EngineInfo, EngineSnapshot
from .speculation.speculator import Speculator
from .stats import EngineStats
from .vocab import Vocab

__all__ = ["Engine", "EngineConfig"]

log = logging.getLogger("warmslot.engine")


class Engine(EngineThread, EngineStep, EngineAdmit, EngineSleep, EngineViews):
    """The engine: its parts, and what any thread may call (see the module docstring)."""

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
        self._published_shape: tuple = ()  # each slot's (request id, prefill done) when last published
        self._published_at = 0.0
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
        self._asleep: UnloadedContext | None = None  # what the snapshot needs while the model is unloaded
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
