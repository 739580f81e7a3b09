"""Messages between the HTTP side and the engine thread.

The HTTP side submits a `GenerateRequest` (token ids plus sampling parameters). The engine
answers through the request's `sink` with lists of `Event`s, one list per engine step at
most, so a busy stream costs one thread hop per step rather than one per token.
"""

from __future__ import annotations

import enum
import queue
import time
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .adapters.adapter_set import NO_ADAPTERS, AdapterSet, scope_of
from .sampling.logprobs import TokenLogprob
from .multimodal.spans import MediaSpan
from .sampling.params import SamplingParams


class FinishReason(str, enum.Enum):
    STOP = "stop"  # end-of-generation token or a stop string
    LENGTH = "length"  # max_tokens or the slot's context is full
    ABORT = "abort"  # the client went away


class Source(str, enum.Enum):
    """Where the reused part of a prompt came from."""

    SLOT = "slot"  # the slot already held it
    FORK = "fork"  # copied from another slot on the device (seq_cp)
    RAM = "ram"  # loaded from the RAM prompt cache
    DISK = "disk"  # loaded from the disk tier
    NONE = "none"  # nothing was reused
    EVICTED = "evicted"  # only as a miss explanation's candidate: a cache entry evicted earlier


class ErrorKind(str, enum.Enum):
    INVALID = "invalid"  # the request itself is bad (a grammar llama.cpp rejects, or one that allows no token)
    CONTEXT = "context"  # the prompt cannot fit a slot
    BUSY = "busy"  # no KV memory left for it while other requests hold it
    TIMEOUT = "timeout"  # its deadline passed
    SHUTDOWN = "shutdown"  # the server is shutting down
    MODEL_OUTPUT = "model_output"  # the model's logits hold a NaN or an infinity: no token can be sampled
    INTERNAL = "internal"


@dataclass(frozen=True, slots=True)
class EngineError:
    kind: ErrorKind
    message: str


class QueueFull(Exception):
    """The waiting queue is at --max-queue."""


class NotReady(Exception):
    """The model is still loading (or failed to load)."""


class ShuttingDown(NotReady):
    """The engine is draining for a shutdown and takes no new requests."""


class Rejected(Exception):
    """The request can never run (a prompt that does not fit a slot, token ids outside the
    vocabulary); `error` says why."""

    def __init__(self, error: EngineError) -> None:
        super().__init__(error.message)
        self.error = error


class Sink(Protocol):
    """Receives a request's events. Called on the engine thread; must not block."""

    def push(self, events: list["Event"]) -> None: ...


@dataclass(slots=True)
class GenerateRequest:
    id: str
    tokens: list[int]
    sink: Sink
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int | None = 256  # None: until the slot's context is full
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    tenant: str = ""
    # token offsets where a message starts: the chat layer's hints for checkpoint positions
    boundaries: tuple[int, ...] = ()
    return_prompt_logits: bool = False
    reuse_prefix: bool = True  # False: evaluate the whole prompt (the slot's contents are still saved)
    # log-probabilities of the generated tokens: None: none; k: each token's and the k most likely
    logprobs: int | None = None
    # the id of a request with the same prompt submitted just before (the other choices of
    # n > 1): this one waits for that prefill and forks it instead of computing the prompt
    sibling_of: str | None = None
    cache_key: str = ""  # prompt_cache_key: requests with the same key prefer the slot that last served it
    session: str = ""  # the client's session (Claude Code's session id): its conversations come back while it runs
    keep_s: float | None = None  # prompt_cache_retention on disk: 0 never written there, None LRU only
    submitted: float = field(default_factory=time.monotonic)
    deadline: float | None = None  # time.monotonic() by which it ends, finished or not
    # images: each a run of placeholder ids in `tokens` (see media.py), in order
    media: tuple[MediaSpan, ...] = ()
    return_progress: bool = False  # report how far the prompt's evaluation got, each step
    origin: str = ""  # what the request came through (an HTTP route), for the crash report
    # llama-server's code-completion limits: a line after the first newline indented less than
    # n_indent ends the reply before it; past t_max_predict_ms of generation, a token with a
    # newline ends it (0: no limit)
    n_indent: int = 0
    t_max_predict_ms: int = 0
    # the LoRA adapters it runs under (ids and scales of the loaded ones; empty: the base model)
    adapters: AdapterSet = NO_ADAPTERS

    def __post_init__(self) -> None:
        assert len(self.tokens) > 0, "a prompt has at least one token"
        assert self.max_tokens is None or self.max_tokens >= 0

    @property
    def scope(self) -> str:
        """The namespace its cached state lives in: the tenant, and the adapter set when it
        has one (adapters/adapter_set.py). What the router, the tiers and the slots compare."""
        return scope_of(self.tenant, self.adapters)


@dataclass(slots=True)
class Reuse:
    """Where a request's prompt came from, and why not more of it (for the miss explanation)."""

    source: Source = Source.NONE
    slot: int = -1
    matched: int = 0  # common token prefix with the best candidate (of any source)
    cached: int = 0  # tokens not evaluated
    restored_checkpoint: int | None = None  # checkpoint position restored, if any
    used_logits: bool = False  # the last prompt token's logits came from a checkpoint
    candidate_len: int = 0  # how many tokens the best candidate holds
    candidate_source: Source = Source.NONE  # where the best candidate was
    # around the first token where the best candidate and the prompt differ:
    context_text: str = ""  # the prompt's own text just before it
    old_text: str = ""  # the candidate's text from there, when it may be quoted (old_quoted)
    new_text: str = ""  # the prompt's text from there
    old_quoted: bool = False  # the candidate's text is the requester's own conversation's
    reason: str = ""
    # --cache-reuse: of `cached`, the tokens that chunks of the slot shifted to their new
    # positions gave (approximate KV: reuse/plan.py, plan_shifts); None: the flag is off
    shifted: int | None = None
    # sequence state this request's start moved between the device and RAM, by direction:
    # "device_to_ram" (slots saved to take a slot, or parked), "ram_to_device" (a cache load),
    # "disk_to_ram" (a disk entry read for it, its chain's bases included)
    state_bytes: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class Usage:
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int = 0
    source: Source = Source.NONE  # where the cached tokens came from; the rest was computed
    queue_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    ttft_s: float = 0.0
    draft_tokens: int = 0  # tokens drafted by speculative decoding
    draft_accepted: int = 0  # of those, accepted (each saved a decode step)
    shifted_tokens: int | None = None  # of cached_tokens, those from shifted chunks (Reuse.shifted); None: off

    def __post_init__(self) -> None:
        assert 0 <= self.cached_tokens <= self.prompt_tokens
        assert self.shifted_tokens is None or 0 <= self.shifted_tokens <= self.cached_tokens
        assert self.cached_tokens == 0 or self.source not in (Source.NONE, Source.EVICTED)

    @property
    def computed_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens


@dataclass(frozen=True, slots=True)
class Progress:
    """How far a prompt's evaluation got: `processed` of its tokens are in memory (the reused
    ones included), `elapsed_s` after the request got its slot."""

    processed: int
    elapsed_s: float


@dataclass(slots=True)
class Event:
    """One step's output for a request: new text and tokens, and at the end the finish."""

    text: str = ""
    tokens: list[int] = field(default_factory=list)
    started: bool = False  # the request got a slot and its prompt is being processed
    admitted_at: float = 0.0  # with `started`: when it got the slot (time.monotonic())
    finish: FinishReason | None = None
    usage: Usage | None = None
    reuse: Reuse | None = None
    error: EngineError | None = None
    prompt_logits: np.ndarray | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per token in `tokens`, if asked
    stop_sequence: str | None = None  # at the finish: the stop string that ended the request, if one did
    progress: Progress | None = None  # with return_progress: the prompt's evaluation so far


class QueueSink:
    """A blocking sink for code that is not asyncio (tests, scripts)."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[list[Event]] = queue.SimpleQueue()

    def push(self, events: list[Event]) -> None:
        self.queue.put(events)

    def collect(self, timeout: float = 120.0) -> "Result":
        result = Result()
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("the request did not finish in time")
            for ev in self.queue.get(timeout=remaining):
                result.add(ev)
                if ev.finish is not None or ev.error is not None:
                    return result


@dataclass(slots=True)
class Result:
    """All of a request's events folded together."""

    text: str = ""
    tokens: list[int] = field(default_factory=list)
    finish: FinishReason | None = None
    usage: Usage | None = None
    reuse: Reuse | None = None
    error: EngineError | None = None
    prompt_logits: np.ndarray | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)

    def add(self, ev: Event) -> None:
        self.text += ev.text
        self.tokens.extend(ev.tokens)
        self.logprobs.extend(ev.logprobs)
        if ev.prompt_logits is not None:
            self.prompt_logits = ev.prompt_logits
        if ev.reuse is not None:
            self.reuse = ev.reuse
        if ev.finish is not None:
            self.finish = ev.finish
            self.usage = ev.usage
        if ev.error is not None:
            self.error = ev.error
