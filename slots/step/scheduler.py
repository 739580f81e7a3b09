"""Batch planning: which tokens go into this step's llama_decode.

Every decoding slot contributes its one pending token (so streams never stall), then
prefilling slots contribute chunks, oldest admission first, within the step's prefill
budget. A chunk stops at the slot's next checkpoint position, so the state there can be
saved right after the decode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..llama_api import Batch
from ..multimodal.spans import next_media_start
from ..slot import Slot


@dataclass(slots=True)
class BatchEntry:
    slot: Slot
    start: int  # position of the first token this entry adds
    n: int  # tokens added
    out_index: int  # batch index whose logits are read after the decode; -1: none
    filler: bool = False  # a throwaway token that keeps the batch's sequence ids consecutive
    draft: tuple[int, ...] = ()  # drafted tokens after the pending one, each with its own row of logits

    @property
    def is_decode(self) -> bool:
        return not self.filler and self.slot.active is not None and self.slot.active.prefill_done


def plan_batch(
    slots: Sequence[Slot], batch: Batch, prefill_budget: int, *, by_sequence: bool = False, filler_budget: int = 0,
    drafts: dict[int, list[int]] | None = None,
) -> list[BatchEntry]:
    """Fill `batch` for one step. Mutates the batch only. `drafts`: tokens drafted after a
    decoding slot's pending token, by slot id, verified in this decode (speculative.py).

    NOTE: with a KV stream per sequence (`by_sequence`), llama.cpp splits a batch into
    micro-batches of consecutive sequence ids that each add the same number of tokens. Laid
    out in sequence order, a step costs one micro-batch for every decoding slot (with the
    first token of each prefill chunk) plus one per prefill chunk; decode tokens first and
    chunks after would break the run of ids at every prefilling slot. A sequence missing in
    the middle breaks the run too: it can get a filler token that the caller cuts off after
    the decode, instead of a micro-batch more that reads every weight again. A filler is not
    free: its attention reads its stream's cells up to the step's longest. `filler_budget`
    is what a micro-batch is worth in cells read (the weights' bytes over a cell's KV bytes;
    0: no fillers); a gap is filled only when its cells cost less and no longer than the
    step's longest stream. In a unified pool the batch is cut in order, so decode tokens go
    first."""
    batch.clear()
    picks: list[tuple[Slot, int]] = []  # (slot, tokens to add)
    drafts = drafts or {}
    for slot in slots:
        active = slot.active
        if active is not None and active.prefill_done and active.pending is not None:
            picks.append((slot, 1 + len(drafts.get(slot.id, ()))))
    budget = min(prefill_budget, batch.free - sum(n for _, n in picks))
    prefilling = [s for s in slots if s.active is not None and not s.active.prefill_done]
    # a quick request's few hundred tokens (router.py) get a step of their own: shared with
    # another prompt's chunk, the step would last as long as that chunk
    quick = [s for s in prefilling if s.active.quick]
    for slot in quick or sorted(prefilling, key=lambda s: s.active.admitted):
        if budget <= 0:
            break
        n = _chunk_length(slot, budget)
        if n <= 0:
            continue  # at an image: decoded apart from the batch (media.py)
        picks.append((slot, n))
        budget -= n
    if by_sequence:
        room = batch.free - sum(n for _, n in picks)  # a filler takes a place in the batch too
        if filler_budget and picks and room > 0:
            picks += [(slot, 0) for slot in _gaps_worth_filling(slots, picks, filler_budget, room)]
        picks.sort(key=lambda pick: pick[0].id)
    entries = [_add(slot, n, batch, drafts.get(slot.id)) if n else _filler(slot, batch) for slot, n in picks]
    _check(entries, batch)
    return entries


STEP_TARGET_S = 0.5  # seconds a prefill step aims at: deadlines and aborts act between steps


def timed_prefill_cap(rate: float, n_ubatch: int, target_s: float = STEP_TARGET_S) -> int:
    """Prefill tokens a step may take so that it lasts about `target_s` at `rate` prefill
    tokens per second (0: not measured yet): a whole number of ubatches, and never less than
    one, since llama.cpp computes in ubatches anyway.

    NOTE: a request's deadline and a client's abort are seen only between two steps. One
    decode of a whole --batch-size prompt took half a minute on a loaded CPU, and a
    `--request-timeout 2` then answered after 29 s. Steps smaller than a ubatch were tried
    and cost more than they gave: on a 2-core CPU, 0.25 s steps of 64 to 96 tokens made a
    911-token cold prefill 1.26x to 1.47x slower than whole steps, for deadlines that a
    one-ubatch step (about a second there) already keeps."""
    if rate <= 0:
        return n_ubatch
    n = int(rate * target_s)
    return max(n_ubatch, n - n % n_ubatch)


def _gaps_worth_filling(slots: Sequence[Slot], picks: list[tuple[Slot, int]], budget: int, room: int) -> list[Slot]:
    """The slots missing between the step's sequence ids whose filler tokens cost less than
    the micro-batch each run of them would otherwise add, at most `room` of them (the
    batch's places left after the step's tokens)."""
    taken = {slot.id for slot, _ in picks}
    longest = max(slot.n_past + n for slot, n in picks)
    by_id = {slot.id: slot for slot in slots}
    fill: list[Slot] = []
    run: list[Slot] = []
    for i in range(min(taken), max(taken) + 1):
        if i not in taken and i not in by_id:  # not in this step (another LoRA adapter set's): no filler
            run = []
            continue
        if i not in taken:
            run.append(by_id[i])
            continue
        if run and max(s.n_past for s in run) < longest and len(run) * longest <= budget and len(fill) + len(run) <= room:
            fill += run
        run = []
    return fill


def _chunk_length(slot: Slot, budget: int) -> int:
    """Prompt tokens of the slot's next prefill chunk: up to its next checkpoint position
    or image."""
    active = slot.active
    stop = active.cuts[0] if active.cuts else len(active.prompt)
    if active.req.media:
        media = next_media_start(active.req.media, slot.n_past)
        stop = stop if media is None else min(stop, media)
    return min(budget, stop - slot.n_past)


def _filler(slot: Slot, batch: Batch) -> BatchEntry:
    batch.add((0,), slot.pos(slot.n_past), slot.id, logits_last=False)
    return BatchEntry(slot, slot.n_past, 1, -1, filler=True)


def _add(slot: Slot, n: int, batch: Batch, draft: list[int] | None = None) -> BatchEntry:
    active = slot.active
    start = slot.n_past
    if active.prefill_done and draft:
        # the pending token and the draft, with logits at every position: row i is sampled
        # for the token after the i-th (speculative.Speculator.verify)
        last = batch.add((active.pending, *draft), slot.pos(start), slot.id, logits_last=True, logits_all=True)
        return BatchEntry(slot, start, n, last - len(draft), draft=tuple(draft))
    if active.prefill_done:
        index = batch.add((active.pending,), slot.pos(start), slot.id, logits_last=True)
        return BatchEntry(slot, start, 1, index)
    prompt = active.prompt
    last = start + n == len(prompt)
    # [start, start+n) of the prompt goes in; logits only for the prompt's last token
    index = batch.add(prompt[start : start + n], slot.pos(start), slot.id, logits_last=last)
    return BatchEntry(slot, start, n, index if last else -1)


def _check(entries: list[BatchEntry], batch: Batch) -> None:
    assert sum(e.n for e in entries) == batch.n
    assert len({e.slot.id for e in entries}) == len(entries), "a slot appears once per step"
    for e in entries:
        assert e.n > 0 and e.start == e.slot.n_past
