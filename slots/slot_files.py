"""Slot files (--slot-save-path): a slot's contents saved to a named file and restored.

The contract is llama-server's (`POST /slots/{id}?action=save|restore|erase`); the file is
the disk tier's verified format (`cache.disk.format`): model fingerprint, tokens,
checkpoints and checksums, so a restore never loads another model's state or a damaged one.

The functions here run on the engine thread through `Engine.call`: they copy a slot's state
out (`image`), load a verified file's contents into a slot (`restore`) or clear it (`erase`).
Reading and writing the file happen on other threads, never on the engine's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from warmslot.cache.checkpoints import Checkpoint, CheckpointList
from warmslot.cache.disk.records import Header, Payload
from warmslot.cache.entries import CacheEntry

from .multimodal.spans import SAME_POSITIONS
from .stats import CopyCause

if TYPE_CHECKING:
    from .engine import Engine


class SlotBusy(Exception):
    """The slot is serving a request; the action waits for it to finish."""


class SlotActionError(Exception):
    """The action cannot be done (no such slot, nothing to save, a file that does not fit)."""


@dataclass(frozen=True, slots=True)
class SlotImage:
    """A copy of a slot's contents (read-only arrays), to be written to a file."""

    tokens: tuple[int, ...]
    state: np.ndarray
    checkpoints: tuple[Checkpoint, ...]
    tenant: str
    prompt_end: int


def _idle_slot(engine: "Engine", slot_id: int):
    if not 0 <= slot_id < len(engine.slots):
        raise SlotActionError(f"Invalid slot ID {slot_id} (the server has {len(engine.slots)})")
    slot = engine.slots[slot_id]
    if slot.active is not None:
        raise SlotBusy(f"slot {slot_id} is busy")
    return slot


def image(engine: "Engine", slot_id: int) -> SlotImage:
    """Copy an idle slot's state and checkpoints out. Engine thread; raises SlotBusy,
    SlotActionError."""
    slot = _idle_slot(engine, slot_id)
    if not slot.tokens:
        raise SlotActionError(f"slot {slot_id} holds no tokens to save")
    state = engine.ctx.state_get(slot.id, partial=False)
    state.flags.writeable = False
    n = len(slot.tokens)
    return SlotImage(tuple(slot.tokens), state, tuple(slot.checkpoints), slot.tenant, min(slot.prompt_end or n, n))


def restore(engine: "Engine", slot_id: int, header: Header, payload: Payload) -> int:
    """Load a verified file's contents into an idle slot; what the slot held goes to the
    prompt cache first. Returns the tokens restored. Engine thread; raises SlotBusy,
    SlotActionError."""
    slot = _idle_slot(engine, slot_id)
    if header.meta.fingerprint != engine.info.state_fingerprint:
        raise SlotActionError("the file was saved by another model or state layout")
    tokens = header.tokens
    if len(tokens) >= engine.ctx.n_ctx_seq:
        raise SlotActionError(f"the file holds {len(tokens)} tokens; a slot holds {engine.ctx.n_ctx_seq}")
    if min(tokens) < 0 or max(tokens) >= engine.model.n_vocab:
        raise SlotActionError("the file has token ids outside the vocabulary")
    if slot.tokens:
        engine.memory.save(slot, CopyCause.OVERWRITE, keep=0)  # the load below clears it
    checkpoints = CheckpointList(engine.config.ctx_checkpoints, engine.config.checkpoint_bytes)
    for c in payload.checkpoints:
        checkpoints.add(c)
    entry = CacheEntry(tokens, payload.state, checkpoints, header.meta.tenant, header.meta.fingerprint,
                       time.monotonic(), prompt_end=header.meta.prompt_end, keep_s=header.meta.keep_s)
    while not engine.memory.load(entry, slot):
        if not engine.prefixes.evict_idle(exclude=slot):
            raise SlotActionError("no room in the KV cache for the file's state")
    slot.last_used = time.monotonic()
    slot.cache_key = ""
    slot.positions, slot.media = SAME_POSITIONS, ()  # a file holds no images: its indices are its positions
    return len(tokens)


def erase(engine: "Engine", slot_id: int) -> int:
    """Clear an idle slot (its contents are dropped, not saved). Returns the tokens it held.
    Engine thread; raises SlotBusy, SlotActionError."""
    slot = _idle_slot(engine, slot_id)
    n = slot.n_past
    engine.memory.clear(slot)
    slot.prompt_end = 0
    return n
