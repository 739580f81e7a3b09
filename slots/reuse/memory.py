"""Moving sequence state: cut, restore, fork, save to and load from the prompt cache.

`SlotMemory` performs every operation that changes what a slot's sequence holds, and keeps
the slot's token record and checkpoints in step with the llama memory. A drafter with a
memory of its own (a draft model, the MTP block) follows: its sequence is saved, loaded and
forked with the slot's. Runs on the engine thread only.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import numpy as np

from warmslot.cache.checkpoints import Checkpoint
from warmslot.cache.entries import CacheEntry, DraftState
from warmslot.cache.prompt_cache import PromptCache

from ..fitting.host_buffers import Staging
from ..llama_api import Batch, Context, MemoryKind, Model
from .plan import ReusePlan, plan_reuse
from ..slot import Slot
from ..stats import CopyCause, EngineStats

log = logging.getLogger("warmslot.memory")

# cells a save leaves out of its read (SlotMemory._read_tail) for the cut to be worth it
TAIL_READ_MIN = 64


class SlotMemory:
    def __init__(self, ctx: Context, model: Model, cache: PromptCache | None, stats: EngineStats, drafter=None,
                 scratch: int | None = None, staging_bytes: int = 0) -> None:
        self.ctx = ctx
        self.model = model
        self.cache = cache
        self.stats = stats
        self.kind = ctx.memory_kind
        self.staging = Staging(ctx.host, staging_bytes)  # whole states passing through host memory (segments)
        # a cross-stream seq_cp was issued into fork_target; llama.cpp performs it at the next decode
        self.fork_pending = False
        self.fork_target: Slot | None = None
        self.fork_donor: Slot | None = None
        # speculative decoding's drafter, when it keeps a sequence per slot (draft_model.py,
        # mtp_draft.py): save_state, load_state and fork follow the slot's
        self.drafter = drafter
        # a sequence id that no slot runs, in one pool of attention memory: a save reads the
        # cells that the prompt cache lacks through it (`_read_scratch`); None: none
        self.scratch = scratch

    # -- what can be kept -----------------------------------------------------------------

    def cutter(self, slot: Slot) -> Callable[[int], bool]:
        """Whether the slot's memory can be cut back to n tokens without a checkpoint."""
        if self.kind is MemoryKind.ATTENTION:
            return lambda n: True
        if self.kind is MemoryKind.SWA:
            n_swa = self.model.info.n_swa
            pos_min = self.ctx.seq_pos_min(slot.id)
            # the first new token, at position n, still sees its whole window
            return lambda n: 0 <= pos_min <= max(0, slot.pos(n) - n_swa)
        return lambda n: False

    def plan(self, slot: Slot, prompt: list[int]) -> ReusePlan:
        return plan_reuse(slot.tokens, slot.checkpoints, prompt, self.cutter(slot))

    # -- operations -------------------------------------------------------------------------

    def apply(self, slot: Slot, plan: ReusePlan) -> int:
        """Bring the slot's memory to the plan's `keep` tokens. Returns what was kept."""
        keep = plan.keep
        # [0, keep) stays in memory | [keep, n_past) is removed
        if plan.restore is not None:
            t0 = time.monotonic()
            if self.ctx.state_set(slot.id, plan.restore.data, partial=True):
                self.stats.checkpoints_restored += 1
                self.stats.checkpoint_restored_bytes += int(plan.restore.data.nbytes)
                self.stats.checkpoint_restore_seconds += time.monotonic() - t0
            else:
                log.warning("slot %d: restoring the checkpoint at %d failed; full prefill", slot.id, keep)
                keep = 0
        if not self.cut(slot, keep):
            log.warning("slot %d: the memory refused a cut at %d; full prefill", slot.id, keep)
            return 0
        return keep

    def cut(self, slot: Slot, keep: int) -> bool:
        """Cut the slot back to its first `keep` tokens (0: clear it). False when the memory
        refused the cut: the slot is then cleared."""
        if keep == 0:
            self.clear(slot)
            return True
        if keep < slot.n_past and not self.ctx.seq_rm(slot.id, slot.pos(keep), -1):
            self.clear(slot)
            return False
        del slot.tokens[keep:]
        slot.checkpoints.drop_after(keep)
        if slot.approx_from is not None and keep <= slot.approx_from:
            slot.approx_from = None
        return True

    def clear(self, slot: Slot) -> None:
        self.ctx.seq_clear(slot.id)
        slot.tokens.clear()
        slot.checkpoints.clear()
        slot.approx_from = None

    def keep_exact(self, slot: Slot) -> None:
        """Cut the slot back to the tokens before its first approximate one (`approx_from`),
        if it has any: before a tier reads the sequence as it is (the disk at shutdown)."""
        if slot.approx_from is not None:
            self.cut(slot, slot.approx_from)

    def shift(self, slot: Slot, plan: ReusePlan) -> int:
        """--cache-reuse: keep the plan's exact prefix, move each of its chunks (plan.shifts,
        from plan_shifts) to follow what is kept, and remove the rest. Returns the prompt
        tokens kept (plan.kept); from plan.keep on they are approximate (`approx_from`).
        Attention memory whose positions are the token indices only (no images)."""
        assert plan.restore is None and self.kind is MemoryKind.ATTENTION and slot.positions.same
        old, kept = slot.tokens, slot.tokens[: plan.keep]
        for move in plan.shifts:
            # [dst, src) removed: what the prompt no longer has (the chunks moved before sit
            # below dst) | [src, src + n) moved to [dst, dst + n) | [src + n, ...) as it was
            assert move.dst == len(kept)
            if not self.ctx.seq_rm(slot.id, move.dst, move.src):
                self.clear(slot)
                return 0
            self.ctx.seq_add(slot.id, move.src, move.src + move.n, move.dst - move.src)
            kept += old[move.src : move.src + move.n]
        # [0, kept) the prompt's prefix, exact up to plan.keep | [kept, ...) removed
        if not self.ctx.seq_rm(slot.id, len(kept), -1):
            self.clear(slot)
            return 0
        slot.tokens = kept
        slot.checkpoints.drop_after(plan.keep)
        slot.approx_from = plan.keep if slot.approx_from is None else min(slot.approx_from, plan.keep)
        return len(kept)

    def fork(self, donor: Slot, target: Slot, upto: int) -> None:
        """Copy the donor's sequence into the target with seq_cp (no host round trip).

        In a unified pool the copy shares cells: attention memory copies [0, upto) only,
        other memory copies everything (its state is one piece) and the caller's plan then
        restores a checkpoint and cuts. With a stream per sequence, llama.cpp copies the
        donor's whole stream on the device at the next decode, and attention memory is cut
        back to `upto` here.

        NOTE: with streams, the copy is pending until the next decode, so until then
        nothing may write the donor's or the target's state (see `fork_pending`)."""
        assert donor is not target
        self.ctx.seq_clear(target.id)
        if not self.ctx.unified:
            self.ctx.seq_cp(donor.id, target.id, -1, -1)
            target.tokens = list(donor.tokens)
            if self.kind.truncatable and upto < len(target.tokens):
                self.ctx.seq_rm(target.id, target.pos(upto), -1)
                del target.tokens[upto:]
            self.fork_pending = True
            self.fork_target, self.fork_donor = target, donor
        elif self.kind.truncatable:
            self.ctx.seq_cp(donor.id, target.id, 0, target.pos(upto))
            target.tokens = donor.tokens[:upto]
        else:
            self.ctx.seq_cp(donor.id, target.id, -1, -1)
            if self.kind is MemoryKind.SWA:
                # NOTE: llama.cpp reuses a sliding-window cell only while a single sequence
                # holds it, so cells shared by seq_cp would stay pinned. Restoring the donor's
                # window as the target's own partial state gives the target private cells.
                window = self.ctx.state_get(donor.id, partial=True)
                self.ctx.state_set(target.id, window, partial=True)
            target.tokens = list(donor.tokens)
        target.checkpoints = donor.checkpoints.copy()
        target.checkpoints.drop_after(len(target.tokens))
        approx = donor.approx_from
        target.approx_from = approx if approx is not None and approx < len(target.tokens) else None
        if self.drafter is not None:
            self.drafter.fork(donor.id, target.id, target.tokens)
        target.tenant = donor.tenant
        target.keep_s, target.session = donor.keep_s, donor.session
        target.prompt_end = 0

    def settle_fork(self, batch: Batch) -> None:
        """A fork between streams is copied by llama.cpp at the next decode, and no decode
        ran after it (its request finished or left at once). Run a one-token decode into the
        target so the copy happens before anything writes either sequence, then cut the
        token (or, on memory that cannot be cut, drop the target's contents)."""
        target = self.fork_target
        pos = target.pos(target.n_past)
        batch.clear()
        batch.add((self.model.bos if self.model.bos >= 0 else 0,), pos, target.id, logits_last=False)
        rc = self.ctx.decode(batch)
        self.fork_pending = False
        if rc != 0 or not self.ctx.seq_rm(target.id, pos, -1):
            self.clear(target)

    def save(self, slot: Slot, cause: CopyCause, keep: int | None = None) -> CacheEntry | None:
        """Copy the slot's contents and checkpoints into the prompt cache (unless an entry
        already serves everything they could). `keep`: how many of the slot's first tokens
        the caller keeps (None: all, and the slot is unchanged). With 0 the slot is cleared
        after the save; on attention memory only the cells that the cache lacks cross the
        bus where that spares enough of the read (`_read`), and a slot cut for that is cut
        back to `keep` after it."""
        if self.cache is None or not slot.tokens:
            return None
        if slot.approx_from is not None:
            # shifted KV (--cache-reuse) is not a cold run's: only the exact prefix goes to
            # the tiers, and only when the caller keeps no more than it
            if keep is None or keep > slot.approx_from:
                log.debug("slot %d: not saved: its tokens from %d on hold shifted chunks", slot.id, slot.approx_from)
                return None
            self.cut(slot, slot.approx_from)
            if not slot.tokens:
                return None
        existing = self.cache.find_covering(slot.tokens, slot.tenant)
        if existing is not None:
            self.cache.touch(existing)
            self._keep_only(slot, keep, False)
            return existing
        state_bytes = self.ctx.state_size(slot.id)
        size = state_bytes + slot.checkpoints.nbytes
        if self.cache.on_evict is None and not self.cache.admits(
                slot.tokens, slot.checkpoints, slot.tenant, slot.prompt_end or None, size, state_bytes, slot.session):
            log.debug("slot %d: not saved: the waiting requests need what the prompt cache holds sooner", slot.id)
            self._keep_only(slot, keep, False)
            return None
        t0 = time.monotonic()
        # a state the cache will store as a segment is read into the staging buffer: the
        # cache copies its tail out (segments.py), and the rest was only passing through
        chain_point = self.cache.chain_point(slot.tokens, slot.tenant)
        transient = chain_point > 0 and self._segment_after(slot, chain_point)
        state, start, cut = self._read(slot, keep, chain_point, transient)
        draft = self.draft_state(slot)
        entry = self.cache.insert(
            slot.tokens, state, slot.checkpoints, slot.tenant, slot.prompt_end or None, slot.keep_s, draft=draft,
            transient=transient, start=start, session=slot.session,
        )
        self._keep_only(slot, keep, cut)
        seconds = time.monotonic() - t0
        self.cache.stats.save_seconds += seconds
        self.stats.add_copy(cause, int(state.nbytes) + (draft.nbytes if draft is not None else 0), seconds)
        if entry is not None:
            log.debug("slot %d: saved %d tokens (%d bytes) to the prompt cache", slot.id, len(entry), entry.nbytes)
        return entry

    def _read(self, slot: Slot, keep: int | None, chain_point: int, staged: bool) -> tuple[np.ndarray, int, bool]:
        """The slot's state for a save whose entry would chain to the cache's first
        `chain_point` tokens: the state (in the staging buffer where `staged`, which the
        cache copies what it keeps out of), the position from which it holds every cell (0: all
        of them), and whether the slot was cut for the read (`_read_tail`).

        NOTE: in one pool, seq_cp only tags cells as the scratch sequence's too (no data
        moves) and a read walks the pool's cells for either sequence alike, so the scratch
        read costs next to nothing beside the slot's and leaves out all of [0, chain_point):
        it is taken where it leaves at least TAIL_READ_MIN cells more out of the read than
        the other ways (a cut of [keep, chain_point), or none). That is a save whose caller
        keeps most of the slot (an editor's next completion of the same file). With a stream
        per sequence, a copy to another stream moves the whole stream, used cells or not,
        and only at a decode (see settle_fork); on the CPU, where the read is a copy in RAM
        too, that costs more than the read it spares, so streams keep the cut."""
        cuttable = keep is not None and chain_point - keep >= TAIL_READ_MIN
        spared = keep if cuttable else chain_point  # cells the scratch read leaves out beyond the other way's
        if self.scratch is not None and self._partial_read(slot) and spared >= TAIL_READ_MIN:
            return self._read_scratch(slot, chain_point), chain_point, False
        start = self._read_tail(slot, keep, chain_point)
        empty = self.staging.empty if staged else None
        return self.ctx.state_get(slot.id, partial=False, empty=empty), start, start > 0

    def _segment_after(self, slot: Slot, chain_point: int) -> bool:
        """Whether the cache can keep only the cells from `chain_point` on: not where a
        sliding window reaches back before them (chains.cuttable), since the cache then keeps
        the state whole. Such a state is read straight into memory of its own, not into the
        staging buffer and copied out after (a copy of every byte, into fresh memory anyway)."""
        n_swa = self.model.info.n_swa if self.kind is MemoryKind.SWA else 0
        return slot.n_past - chain_point > n_swa

    def _partial_read(self, slot: Slot) -> bool:
        """Whether a read may leave out some of the slot's cells: attention memory, whose
        positions are the token indices (no images)."""
        return self.kind is MemoryKind.ATTENTION and slot.positions.same

    def _read_scratch(self, slot: Slot, start: int) -> np.ndarray:
        """The state of the slot's cells from `start` on, read as the scratch sequence's
        after seq_cp tagged them so (one pool: no data moves); the scratch is cleared after,
        and the slot left as it was."""
        assert self.ctx.unified and 0 < start < slot.n_past
        self.ctx.seq_cp(slot.id, self.scratch, slot.pos(start), -1)
        try:
            state = self.ctx.state_get(self.scratch, partial=False, empty=self.staging.empty)
        finally:
            self.ctx.seq_clear(self.scratch)
        self.stats.tail_reads += 1
        self.stats.scratch_reads += 1
        return state

    def _read_tail(self, slot: Slot, keep: int | None, chain_point: int) -> int:
        """Before a save whose caller keeps only the slot's first `keep` tokens: on attention
        memory, drop the cells [keep, chain_point) from the slot's sequence, which the cache
        holds already (the entry it chains to) and the caller drops anyway, so that the state
        read crosses the bus without them. llama.cpp reads a sequence whole; a sequence that
        no longer has those cells is read without them. Returns the position from which the
        state read holds every cell (0: all of them)."""
        if keep is None or not self._partial_read(slot) or chain_point - keep < TAIL_READ_MIN \
                or not self.ctx.seq_rm(slot.id, keep, chain_point):
            return 0
        self.stats.tail_reads += 1
        return chain_point

    def _keep_only(self, slot: Slot, keep: int | None, cut: bool) -> None:
        """After a save: a slot whose caller keeps none of it is cleared, and one that a
        tail read cut (`cut`) is cut back to its first `keep` tokens, where its memory is
        whole again. Any other slot is left for the caller's plan to cut (on memory that
        cannot be cut anywhere, that may restore a checkpoint first)."""
        if keep is not None and (keep == 0 or cut):
            self.cut(slot, keep)

    def draft_state(self, slot: Slot) -> DraftState | None:
        """A copy of the drafter's sequence of the slot (None without such a drafter)."""
        return self.drafter.save_state(slot.id, slot.tokens) if self.drafter is not None else None

    def tail_loads(self) -> bool:
        """Whether a load may write only the cells a slot lacks (`load` with `keep`): in one
        pool of attention memory with a scratch sequence, and no drafter's sequence to
        follow (a drafter's state loads whole)."""
        return self.scratch is not None and self.kind is MemoryKind.ATTENTION and self.drafter is None

    def load(self, entry: CacheEntry, target: Slot, keep: int = 0) -> bool:
        """Copy a cache entry (or a slot file's contents) into the slot. The entry stays in
        the cache, unchanged. `keep`: the slot holds exactly the entry's first `keep` tokens
        (as its own, or forked from another slot): where `tail_loads()` allows and the
        entry's state parses as one position per token, only the cells after them are
        written (`_load_tail`), and a load that finds no room leaves the slot as it was;
        otherwise the slot is cleared and the whole state written. False: no room (or a
        state that does not load)."""
        t0 = time.monotonic()
        state = self._load_tail(entry, target, keep) if keep else None
        if state is False:
            return False
        if state is None:
            self.ctx.seq_clear(target.id)
            # a chained entry (cache/segments.py) is joined into one whole state in host memory
            try:
                state = entry.state if entry.base is None else self.cache.whole_state(entry, self.staging.empty)
            except ValueError as exc:  # links of another layout: never made by one context
                log.warning("slot %d: joining a cache entry of %d tokens failed: %s", target.id, len(entry), exc)
                state = None
            if state is None or not self.ctx.state_set(target.id, state, partial=False):
                log.warning("slot %d: loading a cache entry of %d tokens failed", target.id, len(entry))
                self.clear(target)
                return False
        target.tokens = list(entry.tokens)
        target.checkpoints = entry.checkpoints.copy()
        target.approx_from = None
        target.tenant = entry.tenant
        target.prompt_end = entry.prompt_end
        target.keep_s, target.session = entry.keep_s, entry.session
        n_bytes = int(state.nbytes)
        if self.drafter is not None and entry.draft is not None:
            self.drafter.load_state(target.id, entry.draft)
            n_bytes += entry.draft.nbytes
        seconds = time.monotonic() - t0
        if self.cache is not None:  # None: a slot file restored without a prompt cache
            self.cache.touch(entry)
            self.cache.stats.loaded_bytes += n_bytes
            self.cache.stats.load_seconds += seconds
        self.stats.add_copy(CopyCause.LOAD, n_bytes, seconds)
        return True

    def _load_tail(self, entry: CacheEntry, target: Slot, keep: int):
        """Write the entry's cells from `keep` on into the target, which holds its first
        `keep` tokens: the tail's state is joined in host memory and loaded as the scratch
        sequence's (llama.cpp clears the sequence it loads into, so not into the target),
        then seq_cp tags those cells as the target's too (one pool: no data moves) and the
        scratch is cleared. Returns the tail's state; None where a tail load does not apply
        (load whole); False where it found no room (the target unchanged)."""
        if not self.tail_loads() or self.cache is None or not target.positions.same \
                or target.tokens != list(entry.tokens[:keep]):
            return None
        try:
            tail = self.cache.tail_state(entry, keep, self.staging.empty)
        except ValueError as exc:  # links of another layout: never made by one context
            log.warning("slot %d: joining the tail of a cache entry of %d tokens failed: %s", target.id, len(entry), exc)
            return None
        if tail is None:
            return None
        if not self.ctx.state_set(self.scratch, tail, partial=False):
            self.ctx.seq_clear(self.scratch)
            return False
        self.ctx.seq_cp(self.scratch, target.id, keep, -1)
        self.ctx.seq_clear(self.scratch)
        self.stats.tail_loads += 1
        return tail

    def checkpoint(self, slot: Slot, n: int, logits) -> None:
        """Save the slot's partial state (and the prompt's last logits, if given) at n tokens."""
        assert slot.n_past == n
        t0 = time.monotonic()
        data = None if self.kind.truncatable else self.ctx.state_get(slot.id, partial=True)
        if data is not None:
            self.stats.checkpoint_saved_bytes += int(data.nbytes)
            self.stats.checkpoint_save_seconds += time.monotonic() - t0
        if data is None and logits is None:
            return
        if data is not None:
            data.flags.writeable = False
        if logits is not None:
            logits.flags.writeable = False
        self.stats.checkpoints_evicted += slot.checkpoints.add(Checkpoint(n, data, logits))
        self.stats.checkpoints_created += 1
