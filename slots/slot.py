"""A slot is one sequence of the shared llama context, and the request it is serving."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from warmslot.cache.checkpoints import CheckpointList

from .llama_api import Sampler
from .multimodal.spans import SAME_POSITIONS, MediaSpan, Positions, placeholder_ids
from .requests import Event, GenerateRequest, Progress, Reuse
from .step.text import TextStream


class SlotState(str, enum.Enum):
    IDLE = "idle"
    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(slots=True)
class Active:
    """A request while it holds a slot."""

    req: GenerateRequest
    sampler: Sampler
    text: TextStream
    reuse: Reuse  # what was reused: reuse.cached prompt tokens are not evaluated
    cuts: list[int]  # prompt positions where the prefill stops for a checkpoint, ascending
    admitted: float = field(default_factory=time.monotonic)
    quick: bool = False  # started beside n_busy_max others (router.py): its prefill goes first
    generated: list[int] = field(default_factory=list)
    pending: int | None = None  # sampled, not yet decoded
    first_token_at: float = 0.0
    last_token_at: float = 0.0
    events: list[Event] = field(default_factory=list)
    prefill_done: bool = False
    drafter: Any = None  # speculative.NgramDrafter over this request's history, once it drafts
    n_drafted: int = 0  # tokens drafted for it (speculative decoding)
    n_accepted: int = 0  # of those, accepted
    draft_cap: int = 0  # the next draft's most tokens, from the last one's acceptance (0: the first draft's)
    draft_backoff: int = 0  # steps without drafts after the last fruitless draft (doubles each time)
    draft_skip: int = 0  # steps left to decode without drafting
    draft_rejections: int = 0  # drafts that ended in a rejected token
    shadowing: bool = True  # n-gram drafts are checked against the output, not verified (speculative._shadow)
    shadow: tuple[int, int] | None = None  # (len(generated) when drafted, its first token) being checked

    @property
    def prompt(self) -> list[int]:
        return self.req.tokens

    def event(self) -> Event:
        """This step's event for the request (created on first use)."""
        if not self.events:
            self.events.append(Event())
        return self.events[-1]

    def report_progress(self, processed: int, *, at_start: bool = False) -> None:
        """With return_progress: `processed` prompt tokens are in memory. Each report is an
        event of its own (a step may report the start and a chunk)."""
        if not self.req.return_progress:
            return
        event = self.event()
        if event.progress is not None or event.tokens:
            event = Event()
            self.events.append(event)
        event.progress = Progress(processed, 0.0 if at_start else time.monotonic() - self.admitted)


@dataclass(slots=True)
class Slot:
    id: int
    checkpoints: CheckpointList
    tokens: list[int] = field(default_factory=list)  # what the sequence memory holds, in order
    tenant: str = ""
    last_used: float = 0.0
    active: Active | None = None
    prompt_end: int = 0  # length of the last prompt served (a divergence before it loses a prompt)
    cache_key: str = ""  # the prompt_cache_key of the last request served
    session: str = ""  # the client session of the conversation it holds (GenerateRequest.session)
    keep_s: float | None = None  # the disk retention of what it holds (see GenerateRequest)
    # --cache-reuse: its tokens from this index on were computed after a chunk whose KV was
    # shifted (reuse/plan.py, plan_shifts), so they differ from a cold run's; None: all exact.
    # Such tokens stay on the device: a save to the prompt cache keeps only [0, approx_from)
    approx_from: int | None = None
    # where its tokens sit in the model's memory: set from each request's images before the
    # slot's memory is cut or filled for it (the memory then holds a prefix of its prompt)
    positions: Positions = SAME_POSITIONS
    media: tuple[MediaSpan, ...] = ()  # the images of the request that positions came from

    def pos(self, index: int) -> int:
        """The memory position of the slot's token `index` (see media_spans.Positions)."""
        return self.positions(index)

    def images(self) -> list[MediaSpan]:
        """The images its memory holds whole (those of `media` its tokens still hold)."""
        n = len(self.tokens)
        return [s for s in self.media if s.end <= n and self.tokens[s.start] == placeholder_ids(s.chunk.media_id, 1)[0]]

    @property
    def state(self) -> SlotState:
        if self.active is None:
            return SlotState.IDLE
        return SlotState.DECODE if self.active.prefill_done else SlotState.PREFILL

    @property
    def n_past(self) -> int:
        return len(self.tokens)
