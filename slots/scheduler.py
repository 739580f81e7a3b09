"""Batch planning: which tokens go into this step's llama_decode.

Every decoding slot contributes its one pending token (so streams never stall), then
prefilling slots contribute chunks, oldest admission first, within the step's prefill
budget. A chunk stops at the slot's next checkpoint position, so the state there can be
saved right after the decode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .llama_api import Batch
from .slot import Slot


@dataclass(slots=True)
class BatchEntry:
    slot: Slot
    start: int  # position of the first token this entry adds
    n: int  # tokens added
    out_index: int  # batch index whose logits are read after the decode; -1: none

    @property
    def is_decode(self) -> bool:
        return self.slot.active is not None and self.slot.active.prefill_done


def plan_batch(slots: Sequence[Slot], batch: Batch, prefill_budget: int) -> list[BatchEntry]:
    """Fill `batch` for one step. Mutates the batch only."""
    batch.clear()
    entries: list[BatchEntry] = []
    for slot in slots:
        active = slot.active
        if active is not None and active.prefill_done and active.pending is not None:
            index = batch.add((active.pending,), slot.n_past, slot.id, logits_last=True)
            entries.append(BatchEntry(slot, slot.n_past, 1, index))
    budget = min(prefill_budget, batch.free)
    prefilling = [s for s in slots if s.active is not None and not s.active.prefill_done]
    for slot in sorted(prefilling, key=lambda s: s.active.admitted):
        if budget <= 0:
            break
        entry = _prefill_chunk(slot, batch, budget)
        entries.append(entry)
        budget -= entry.n
    _check(entries, batch)
    return entries


def _prefill_chunk(slot: Slot, batch: Batch, budget: int) -> BatchEntry:
    active = slot.active
    prompt = active.prompt
    start = slot.n_past
    stop = active.cuts[0] if active.cuts else len(prompt)
    n = min(budget, stop - start)
    last = start + n == len(prompt)
    # [start, start+n) of the prompt goes in; logits only for the prompt's last token
    index = batch.add(prompt[start : start + n], start, slot.id, logits_last=last)
    return BatchEntry(slot, start, n, index if last else -1)


def _check(entries: list[BatchEntry], batch: Batch) -> None:
    assert sum(e.n for e in entries) == batch.n
    assert len({e.slot.id for e in entries}) == len(entries), "a slot appears once per step"
    for e in entries:
        assert e.n > 0 and e.start == e.slot.n_past
