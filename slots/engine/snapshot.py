"""What the HTTP side may know of the engine: typed, immutable views.

- `EngineInfo`: facts fixed once the model is loaded (model, context sizes, memory kind,
  layout), published once.
- `EngineSnapshot`: the slots, the queue and the prompt cache at one instant, built on the
  engine thread. The engine publishes a light one (no per-entry detail) after every step, for
  /metrics; /slots asks for a detailed one between steps. Nothing outside the engine thread
  reads a slot or the cache directly.
"""

from __future__ import annotations

import array
import hashlib
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from warmslot.cache.prefix_trie import distinct_tokens

from ..adapters.adapter_set import AdapterInfo, tenant_of
from ..llama_api import MemoryKind

if TYPE_CHECKING:
    from warmslot.cache.prompt_cache import PromptCache

    from ..fitting.capacity import Capacity, DeviceMemory
    from ..fitting.context_size import ContextChoice
    from ..llama_api import Context
    from ..stats import EngineStats
    from ..slot import Slot


@dataclass(frozen=True, slots=True)
class EngineInfo:
    model_name: str
    model_path: str
    arch: str
    description: str
    fingerprint: str
    n_params: int
    size_bytes: int
    n_vocab: int
    n_ctx_train: int
    chat_template: str | None
    memory: MemoryKind
    n_slots: int  # requests that run at once (--parallel)
    n_seq: int  # sequences in all, spares included
    kv_unified: bool
    n_ctx: int  # KV cells in all
    n_ctx_slot: int  # the most tokens one slot holds: a request's prompt plus its output
    kv_bytes_per_token: int | None  # attention KV bytes of one token (None: unknown)
    context: "ContextChoice | None" = None  # how n_ctx was chosen
    pinned_limit: int = 0  # page-locked host memory the states may take (0: none)
    capacity: "Capacity | None" = None  # what is held where, once loaded
    state_fingerprint: str = ""  # the model and the state layout: saved states load only where it is equal
    device_memory: tuple[DeviceMemory, ...] = ()  # model and state bytes by device, as llama.cpp allocated them
    adapters: tuple[AdapterInfo, ...] = ()  # the LoRA adapters loaded (--lora, --lora-scaled), by id

    @property
    def n_ctx_slots(self) -> int:
        """The slots' context, as -c gives it: spare streams (one per sequence) not counted."""
        return self.n_ctx if self.kv_unified else self.n_slots * self.n_ctx_slot


@dataclass(frozen=True, slots=True)
class CheckpointView:
    n_tokens: int
    bytes: int
    logits: bool


@dataclass(frozen=True, slots=True)
class ImageView:
    """An image or an audio clip in a slot's memory: where its run is, and a hash of its bytes
    (never them)."""

    hash: str
    start: int
    n_tokens: int
    n_pos: int  # memory positions it takes (fewer than its tokens with M-RoPE)
    kind: str = "image"  # or "audio"


@dataclass(frozen=True, slots=True)
class RequestView:
    id: str
    n_prompt: int
    n_cached: int
    n_generated: int
    n_drafted: int = 0  # tokens drafted for it by speculative decoding
    n_accepted: int = 0  # of those, accepted


@dataclass(frozen=True, slots=True)
class SlotView:
    id: int
    state: str  # idle, prefill or decode
    n_tokens: int
    tenant: str  # a short hash; "" for the anonymous tenant
    content_hash: str
    checkpoint_bytes: int
    idle_s: float
    checkpoints: tuple[CheckpointView, ...] = ()
    request: RequestView | None = None
    redacted: bool = False  # another tenant's slot: only its id and state are shown
    spec_drafted: int = 0  # tokens drafted in this slot since the start (speculative decoding)
    spec_accepted: int = 0  # of those, accepted
    images: tuple[ImageView, ...] = ()  # the images and clips its memory holds, in order


@dataclass(frozen=True, slots=True)
class EntryView:
    n_tokens: int
    bytes: int
    idle_s: float
    tenant: str
    content_hash: str
    checkpoints: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class CacheView:
    budget_bytes: int
    bytes: int
    n_entries: int
    tokens: int = 0  # tokens whose state it stores: a shared prefix once (segments)
    entries: tuple[EntryView, ...] = ()  # most recently used first; only in a detailed snapshot


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    memory: str
    n_ctx: int
    slots: tuple[SlotView, ...]
    queue_depth: int
    cache: CacheView | None
    pinned_bytes: int = 0
    pinned_free_bytes: int = 0
    unpinned_state_bytes: int = 0  # states that found no pinned room (a count of bytes, CUDA only)
    # tokens whose state the device's sequences hold: in one pool a prefix that sequences
    # share counts once (an underestimate where two computed it apart), else every sequence's
    device_tokens: int = 0
    taken: float = field(default_factory=time.monotonic)

    def states(self) -> Counter:
        return Counter(s.state for s in self.slots)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        del out["taken"]
        return out


def content_hash(tokens) -> str:
    """A short hash of a token list (equal contents, equal hash)."""
    return hashlib.blake2b(array.array("i", tokens).tobytes(), digest_size=6).hexdigest() if tokens else ""


def tenant_hash(tenant: str) -> str:
    return hashlib.blake2b(tenant.encode(), digest_size=4).hexdigest() if tenant else ""


def take_snapshot(
    slots: "Sequence[Slot]", cache: "PromptCache | None", ctx: "Context", queue_depth: int,
    *, detail: bool, visible: Callable[[str], bool] | None = None, stats: "EngineStats | None" = None,
) -> EngineSnapshot:
    """Describe the engine's slots, queue and prompt cache. Runs on the engine thread (it
    reads slots and the cache).

    `visible(tenant)` says whose slots and cache entries may be described in detail (None:
    everyone's). Another tenant's slot shows its id and state only, its entries not at all:
    a content hash, a length or a checkpoint offset could confirm a guess of its prompt."""
    now = time.monotonic()
    shown = visible or (lambda tenant: True)
    views = tuple(
        _slot_view(slot, now, detail, stats) if shown(tenant_of(slot.tenant)) else SlotView(slot.id, slot.state.value, 0, "", "", 0, 0.0, redacted=True)
        for slot in slots
    )
    cache_view = None
    if cache is not None:
        entries = ()
        if detail:
            entries = tuple(
                EntryView(len(e), e.nbytes, round(now - e.last_used, 3), tenant_hash(tenant_of(e.tenant)),
                          content_hash(e.tokens), tuple(c.n_tokens for c in e.checkpoints))
                for e in reversed(list(cache.entries())) if shown(tenant_of(e.tenant))
            )
        cache_view = CacheView(cache.budget, cache.nbytes, cache.n_entries, tokens=cache.n_tokens, entries=entries)
    held = [slot.tokens for slot in slots if slot.tokens]
    host = ctx.host
    return EngineSnapshot(
        memory=ctx.memory_kind.value,
        n_ctx=ctx.n_ctx,
        slots=views,
        queue_depth=queue_depth,
        cache=cache_view,
        pinned_bytes=host.allocated_bytes,
        pinned_free_bytes=host.free_bytes,
        unpinned_state_bytes=host.ordinary_bytes,
        device_tokens=distinct_tokens(held) if ctx.unified else sum(map(len, held)),
    )


def _slot_view(slot, now: float, detail: bool, stats: "EngineStats | None" = None) -> SlotView:
    active = slot.active
    request = None
    if active is not None:
        request = RequestView(
            active.req.id, len(active.prompt), active.reuse.cached, len(active.generated), active.n_drafted, active.n_accepted,
        )
    drafted = accepted = 0
    if stats is not None and stats.spec_drafted:
        drafted = sum(n for (_, slot_id), n in list(stats.spec_drafted.items()) if slot_id == slot.id)
        accepted = sum(n for (_, slot_id), n in list(stats.spec_accepted.items()) if slot_id == slot.id)
    return SlotView(
        id=slot.id,
        state=slot.state.value,
        n_tokens=slot.n_past,
        tenant=tenant_hash(tenant_of(slot.tenant)) if detail else "",
        content_hash=content_hash(slot.tokens) if detail else "",
        checkpoint_bytes=slot.checkpoints.nbytes,
        idle_s=round(now - slot.last_used, 3) if slot.last_used and active is None else 0.0,
        checkpoints=tuple(CheckpointView(c.n_tokens, c.nbytes, c.logits is not None) for c in slot.checkpoints) if detail else (),
        request=request,
        spec_drafted=drafted,
        spec_accepted=accepted,
        images=tuple(ImageView(s.chunk.media_id[:16], s.start, s.chunk.n_tokens, s.chunk.n_pos, s.chunk.kind) for s in slot.images()) if detail else (),
    )
