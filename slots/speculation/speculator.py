"""Speculative decoding: drafts verified inside the step's one decode.

Drafting: `Speculator.drafts` plans each step's drafts, made from the slot's own tokens
(`ngram_drafter.NgramDrafter`), by a draft model (draft_model.py) or by the model's MTP layers
(mtp_draft.py); the settings are `spec_config.SpecConfig`.

Verification (`Speculator.verify`): the draft goes into the step's batch right after the
slot's pending token, with logits at every position, next to the other slots' tokens and
prefill chunks (continuous batching). After the decode the request's own sampler chain
samples the rows in order: the row of the pending token gives a token; while it equals the
next drafted token, that drafted token was decoded at the right place with the right
history, so it enters the slot's history as a decoded token would, and its row gives the
next token. The first token that differs (or the last row) ends the step, and the memory of
the drafted tokens after it is removed with seq_rm. A draft that gains nothing (none of it
accepted, or a draft model that proposed nothing) costs its step all the same. So an n-gram
request drafts without verifying at first, and again after such a draft: its drafts are
checked for free against the tokens it then emits, and once one would have had its first
token accepted, drafts are verified (`_shadow`). A draft model's drafts cost a decode to
make, so there the request decodes a few steps without drafting instead, twice as many after
each such draft (BACKOFF_MAX).

Every emitted token is thus sampled by the request's chain (grammar, penalties, logit bias,
temperature, seed) from the logits it would have had without speculation, one sample per
emitted token as without speculation: greedy output is unchanged, and no token a grammar
rejects is ever accepted, since the chain's grammar sampler chose it. For temperature > 0
this is the standard rule for a deterministic draft: a drafted token is accepted with
probability p_target(token), and on rejection the token emitted is distributed as p_target
with the drafted token removed and renormalised.

Recurrent and hybrid memory cannot be cut back. Where the model supports it, llama.cpp keeps
the recurrent state after each of a sequence's last N tokens (`--spec-rs-snapshots`, its
n_rs_seq; see RS_SNAPSHOTS), and a rejected part of a draft of up to N tokens is removed by
seq_rm alone. Otherwise, and for longer drafts, the slot's recurrent state is copied before
the step that verifies the draft (`Context.state_get`, partial); when part of the draft is
rejected, the copy is put back, the attention cells past it removed, and the pending and
accepted tokens decoded again into that sequence alone, after every row of the step is
sampled (`settle`). That costs a state copy per draft and a small decode per rejection, and
the step costs it learns make drafts shorter where it does not pay. Sliding-
window memory drops cells that fall out of the window while the draft is decoded; the draft
is safe only while the slot's tokens stay within one micro-batch of the decode, so there a
step drafts for one slot only, and only in steps without prefill chunks and within one ubatch
(the window is checked after every rollback).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Sequence

from ..llama_api import Batch, Context, MemoryKind
from .ngram_drafter import NgramDrafter
from .ngram_memory import NgramMemory
from .spec_config import MTP, SpecConfig
from ..stats import EngineStats
from .step_cost import StepCost, best_length

if TYPE_CHECKING:
    from ..step.postprocess import Postprocess
    from ..step.scheduler import BatchEntry
    from ..slot import Active, Slot

log = logging.getLogger("warmslot.speculative")

# A request's first draft, and the next after a rejection, is at most this many tokens (after a
# rejection, plus the accepted run); it doubles with every draft accepted whole, up to
# --draft-max. A first step of a new shape costs more than later ones (on an H200, Qwen3-8B
# shape, the first 8 x 17-token step took 79 ms, repeated ones about 25 ms), and verifying a token
# that is then rejected is not free: on 2 shared CPU cores (Gemma 3 270M, Q4_K) a step of 17
# tokens took about 4 times a one-token step, and a rewrite-a-file turn that accepted 70% of
# 16-token drafts ran no faster than without drafts (scripts/bench_spec.py).
DRAFT_FLOOR = 4
# A draft that gains nothing still costs its step: on an H100 (Qwen3-8B shape) a step verifying
# four rejected tokens per slot gave 32% fewer tokens/s than one-token steps at -np 1 and about
# half at -np 4 and 8 (scripts/bench_spec.py --verify-cost), and a draft model's step costs its
# decode even when no token passes --draft-p-min. An n-gram request then checks its drafts
# against its output before verifying one again (_shadow); a draft model's request decodes
# that many steps without drafting: BACKOFF_MIN, twice that, ... up to BACKOFF_MAX, and a draft
# with an accepted token starts over. An attempt that proposes nothing still costs the draft
# model's catch-up and decode: about 4 ms on an H200 (Qwen3-8B shape, a 4-layer draft model),
# which with 1, 2, 4, ... was 4% of a request's decode time.
BACKOFF_MIN = 4
BACKOFF_MAX = 128


def _shadow(active: "Active", draft: list[int]) -> bool:
    """A request's n-gram drafts are first made but not verified: each is kept and its first
    token compared with the token the request then emits, which is free. The first draft
    whose first token would have been accepted ends this (True: verify drafts, this step's
    first). After a verified draft that gained nothing it starts again. A request whose
    drafts miss thus pays for no verification, and one that starts to copy its context
    drafts from the next step on."""
    kept = active.shadow
    if kept is not None and len(active.generated) > kept[0]:
        active.shadow = None
        if active.generated[kept[0]] == kept[1]:
            active.shadowing = False
            return True
    if active.shadow is None and draft:
        active.shadow = (len(active.generated), draft[0])  # it guesses what follows generated[-1]
    return False


def _back_off(active: "Active") -> None:
    """No drafts for the next BACKOFF_MIN, twice that, ... BACKOFF_MAX steps of this request."""
    active.draft_backoff = min(BACKOFF_MAX, max(BACKOFF_MIN, 2 * active.draft_backoff))
    active.draft_skip = active.draft_backoff


class Speculator:
    """Plans each step's drafts and verifies them after the decode. Engine thread only.
    `draft`: the loaded draft model (draft_model.DraftModel) when the type is "draft"."""

    def __init__(self, config: SpecConfig, ctx: Context, stats: EngineStats, n_swa: int, draft=None) -> None:
        self.config = config
        self.draft_model = draft
        self.ctx = ctx
        self.stats = stats
        self.kind = ctx.memory_kind
        self.n_swa = n_swa
        self.reason: str | None = None  # why it turned off while running (see _check_window)
        self.on = config.on
        self._skip_next = False  # the last batch with drafts did not fit the KV pool
        self.cost = StepCost()
        # recurrent and hybrid memory: each drafting slot's state before the step, and the
        # rollbacks due once the step's rows are sampled (see the module docstring)
        self._rollback = self.kind in (MemoryKind.RECURRENT, MemoryKind.HYBRID)
        self._snapshots = ctx.n_rs_seq if self._rollback else 0  # drafts this long need no state copy
        self._saved: dict[int, tuple[int, object]] = {}
        self._due: list[tuple["Slot", int, object]] = []
        self._redo = Batch(config.n_max + 1, ctx.n_seq_max) if self._rollback and self.on else None
        ngram = self.on and draft is None and config.ngram_memory > 0
        self.memory = NgramMemory(config.ngram_n, config.ngram_memory) if ngram else None
        if self.on:
            how = "the model's MTP layers" if config.type == MTP else f"draft model {config.draft_model}" if draft is not None else f"n-grams of {config.ngram_n} down to {min(config.ngram_n, config.ngram_min)}"
            log.info(
                "speculative decoding: %s, %s, up to %d drafted tokens (at least %d)",
                config.type, how, config.n_max, config.n_min,
            )

    @property
    def model_drafts(self) -> bool:
        """Whether drafting runs a model (a draft model, the MTP block): decodes of its own."""
        return self.on and self.draft_model is not None

    # -- planning -----------------------------------------------------------------------

    def limits(self, active: "Active") -> tuple[int, int, float]:
        """(n_max, n_min, p_min) for this request: the server's, narrowed by the request's own."""
        cfg = self.config
        n_max, n_min, p_min = cfg.n_max, cfg.n_min, cfg.p_min
        own = active.req.sampling.speculative
        if own is not None:
            if own.n_max is not None:
                n_max = min(n_max, own.n_max)
            if own.n_min is not None:
                n_min = own.n_min
            if own.p_min is not None:
                p_min = own.p_min
        return n_max, n_min, p_min

    def drafts(self, slots: Sequence["Slot"], capacity: int, n_ubatch: int, fork_pending: bool) -> dict[int, list[int]]:
        """The drafted tokens of this step, by slot id (each after its pending token)."""
        self._saved.clear()
        if not self.on or fork_pending:
            return {}
        if self._skip_next:
            self._skip_next = False
            return {}
        decoding = [s for s in slots if s.active is not None and s.active.prefill_done and s.active.pending is not None]
        if not decoding:
            return {}
        window = self.kind is MemoryKind.SWA
        if window and any(s.active is not None and not s.active.prefill_done for s in slots):
            return {}  # a prefill chunk could put the draft in another micro-batch (see above)
        room = capacity - len(decoding)
        if window:
            room = min(room, n_ubatch - len(decoding))
        chosen: list[tuple["Slot", list[int]]] = []
        cost = self.cost.model()
        planned: list[tuple["Slot", int, int, float]] = []  # a model drafts for these together, below
        for slot in decoding:
            if room <= 0:
                break
            if slot.active.draft_skip > 0:
                slot.active.draft_skip -= 1
                continue
            if self.draft_model is not None:
                plan = self._plan(slot, room, cost)
                if plan is not None and not slot.active.req.media:  # a model would read an image's ids as tokens
                    planned.append((slot, *plan))
                    room -= plan[0]  # what its draft may take at most
                    if window:
                        break
                continue
            draft = self._draft(slot, room, cost)
            if draft:
                chosen.append((slot, draft))
                room -= len(draft)
                if window:
                    break
        if planned:
            t0 = time.monotonic()
            made = self.draft_model.draft_batch([(s.id, s.tokens + [s.active.pending], limit, p_min) for s, limit, _, p_min in planned])
            self.stats.spec_drafter_calls += 1
            self.stats.spec_drafter_seconds += time.monotonic() - t0
            for (slot, _, n_min, _), draft in zip(planned, made):
                if not draft:  # the draft model's step was paid for nothing
                    _back_off(slot.active)
                if len(draft) >= max(1, n_min):
                    chosen.append((slot, draft))
        for slot, draft in chosen:
            if self._rollback and len(draft) > self._snapshots:
                self._saved[slot.id] = (slot.n_past, self.ctx.state_get(slot.id, partial=True))
                self.stats.spec_state_copies += 1
        return {slot.id: draft for slot, draft in chosen}

    def _plan(self, slot: "Slot", room: int, cost: tuple[float, float] | None) -> tuple[int, int, float] | None:
        """(the most tokens to draft, n_min, p_min) for this slot's request; None: no draft."""
        active = slot.active
        n_max, n_min, p_min = self.limits(active)
        limit = min(n_max, room, self.ctx.n_ctx_seq - slot.n_past - 2)
        if active.req.max_tokens is not None:
            limit = min(limit, active.req.max_tokens - len(active.generated) - 1)
        limit = min(limit, max(active.draft_cap or DRAFT_FLOOR, n_min))
        if cost is not None and limit > 0:
            # as long as it pays for itself at this request's acceptance so far (one accepted
            # and one rejected token assumed to start with); at least one token, since a
            # draft that is never tried never shows what it would gain (BACKOFF_MAX bounds that)
            p = (active.n_accepted + 1) / (active.n_accepted + active.draft_rejections + 2)
            limit = max(1, min(limit, best_length(p, *cost, limit)))
        if limit <= 0 or limit < n_min:
            return None
        return limit, n_min, p_min

    def _draft(self, slot: "Slot", room: int, cost: tuple[float, float] | None) -> list[int]:
        """An n-gram draft for the slot (drafters that are models draft in `draft_batch`)."""
        plan = self._plan(slot, room, cost)
        if plan is None:
            return []
        limit, n_min, _ = plan
        active = slot.active
        if active.drafter is None:
            cfg = self.config
            active.drafter = NgramDrafter(cfg.ngram_n, cfg.ngram_m, self.memory, active.req.tenant, cfg.ngram_min)
        draft = active.drafter.draft(slot.tokens, active.pending, limit)
        cut = next((i for i, t in enumerate(draft) if t < 0), len(draft))
        draft = draft[:cut]  # an image's placeholder ids are no tokens to decode
        if active.shadowing and not _shadow(active, draft):
            self.stats.spec_drafts_checked += bool(draft)
            return []
        return draft if len(draft) >= max(1, n_min) else []

    def after_decode(self, entries: Sequence["BatchEntry"], batch: Batch) -> None:
        """The target decoded `batch` (synchronized): a drafter that follows it sees it."""
        if self.on and self.draft_model is not None:
            self.draft_model.after_decode(entries, batch)

    def remember(self, slot: "Slot") -> None:
        """A request ends (its slot still holds it): its output joins the n-gram memory."""
        active = slot.active
        if self.memory is not None and not active.req.media:
            self.memory.remember(active.req.tenant, active.prompt, active.generated)

    def shape(self, entries: Sequence["BatchEntry"]) -> tuple[int, int, bool] | None:
        """(decoding slots, drafted tokens, whether any prompt is in the step) of a batch, for
        StepCost; None while speculation is off."""
        if not self.on:
            return None
        decoding = [e for e in entries if e.is_decode]
        return len(decoding), sum(len(e.draft) for e in decoding), len(decoding) < sum(1 for e in entries if not e.filler)

    def observe(self, shape: tuple[int, int, bool] | None, seconds: float) -> None:
        """A step's time (with its shape), for StepCost."""
        if shape is not None:
            self.cost.observe(*shape, seconds)

    def kv_full(self, entries: Sequence["BatchEntry"]) -> bool:
        """The decode found no room in the KV pool. True when the batch had drafts: the next
        step runs without them (memory is unchanged) before anything else gives way."""
        if any(e.draft for e in entries):
            self._skip_next = True
            return True
        return False

    def close(self) -> None:
        if self.draft_model is not None:
            self.draft_model.close()
            self.draft_model = None

    # -- after the decode ---------------------------------------------------------------

    def verify(self, entry: "BatchEntry", post: "Postprocess") -> int:
        """Sample the entry's rows in order while the samples equal the draft; returns the
        drafted tokens accepted. The slot's history grows by the pending token and the
        accepted ones; the memory of the rest is removed."""
        slot = entry.slot
        active = slot.active
        draft = entry.draft
        accepted = 0
        active.n_drafted += len(draft)  # counted before the request may end in on_token
        for i in range(len(draft) + 1):
            # the token at batch row i was decoded with the history the sampler has seen
            slot.tokens.append(draft[i - 1] if i else active.pending)
            active.pending = None
            if i:
                accepted += 1
                active.n_accepted += 1
            token = post.sample(slot, entry.out_index + i)
            if slot.active is None or i == len(draft) or token != draft[i]:
                break
        end = entry.start + entry.n
        if slot.n_past < end and slot.id in self._saved:
            n, state = self._saved.pop(slot.id)
            self._due.append((slot, n, state))
        elif slot.n_past < end and self._rollback:  # to the snapshot after the last accepted token
            t0 = time.monotonic()
            if not self.ctx.seq_rm(slot.id, slot.pos(slot.n_past), -1):
                self._due.append((slot, slot.n_past, None))  # failed: settle clears the slot
            self.stats.spec_rollbacks += 1
            self.stats.spec_rollback_seconds += time.monotonic() - t0
        elif slot.n_past < end:
            self.ctx.seq_rm(slot.id, slot.pos(slot.n_past), -1)
            self._check_window(slot)
        # the next draft follows this one's acceptance: twice as long after a whole draft was
        # accepted, a little past the accepted run after a rejection (see DRAFT_FLOOR)
        active.draft_cap = 2 * len(draft) if accepted == len(draft) else accepted + DRAFT_FLOOR
        if accepted < len(draft):
            active.draft_rejections += 1
        if accepted:
            active.draft_backoff = 0
        elif self.draft_model is None:
            active.shadowing, active.shadow = True, None  # see _shadow
        else:
            _back_off(active)
        kind = self.config.type
        self.stats.spec_drafted[(kind, slot.id)] += len(draft)
        self.stats.spec_accepted[(kind, slot.id)] += accepted
        return accepted

    def settle(self) -> list["Slot"]:
        """Recurrent and hybrid memory: roll back the slots whose drafts were cut (after the
        step's rows are sampled: a decode here overwrites the step's logits). Each gets its
        state from before the step, loses the attention cells past it, and decodes again the
        tokens it kept. Returns the slots whose rollback failed (their memory is cleared)."""
        failed = []
        for slot, n, state in self._due:
            t0 = time.monotonic()
            ok = state is not None  # None: a rollback to a snapshot failed (counted then)
            if ok:
                batch = self._redo
                batch.clear()
                batch.add(slot.tokens[n:], slot.pos(n), slot.id, logits_last=False)
                ok = (
                    self.ctx.state_set(slot.id, state, partial=True) and self.ctx.seq_rm(slot.id, slot.pos(n), -1)
                    and self.ctx.decode(batch) == 0
                )
                self.stats.spec_rollbacks += 1
                self.stats.spec_rollback_seconds += time.monotonic() - t0
            if not ok:
                log.error("slot %d: rolling back a draft failed; the slot's memory is cleared", slot.id)
                self.ctx.seq_clear(slot.id)
                del slot.tokens[:]
                failed.append(slot)
        self._due.clear()
        return failed

    def _check_window(self, slot: "Slot") -> None:
        """Sliding-window memory: the next token's window must still be in memory."""
        if self.kind is not MemoryKind.SWA:
            return
        n = slot.pos(slot.n_past)
        pos_min = self.ctx.seq_pos_min(slot.id)
        if not 0 <= pos_min <= max(0, n - self.n_swa):
            self.on = False
            self.reason = f"the sliding window of slot {slot.id} lost cells during a draft; speculative decoding is off"
            log.error("%s (window starts at %d, next position %d)", self.reason, pos_min, n)
