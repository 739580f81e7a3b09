"""Bringing a route's prefix into its slot: the steps of admission that move memory.

`Prefixes.take` applies a route (keep the slot's own contents, fork another slot's, load a
prompt-cache entry or a fetched disk entry, or start empty), saves what the slot held first when it is worth it,
and says what happened (`Reuse`). It also makes room: idle slots move to the prompt cache
when a request starts (`park_idle`) or when the KV pool is full (`evict_idle`). Runs on the
engine thread.
"""

from __future__ import annotations

import logging

from warmslot.cache.demand import Demand
from warmslot.cache.lookahead import give_up_first
from warmslot.cache.prefix_trie import common_prefix, distinct_tokens
from warmslot.cache.prompt_cache import PromptCache

from ..llama_api import Context, Model
from .memory import SlotMemory
from ..multimodal.spans import Positions, placeholder_ids
from ..requests import GenerateRequest, Reuse, Source
from .plan import ReusePlan
from .router import Fork, FromDisk, KeepSlot, Load, Route, held_elsewhere, slot_uses
from ..slot import Slot
from ..stats import CopyCause, EngineStats
from .tiers.disk import DiskTier

log = logging.getLogger("warmslot.engine")

# a request that shares all but this many tokens of a slot's previous prompt continues that
# conversation: the slot's contents are not worth a copy in the prompt cache
SAVE_MIN_LOSS = 32
# a prefix of a prompt-cache entry this long, held by the slot it loads into or by another
# slot, is kept and only the entry's cells after it written (SlotMemory.load with keep)
TAIL_LOAD_MIN = 64


class Prefixes:
    def __init__(
        self,
        slots: list[Slot],
        memory: SlotMemory,
        cache: PromptCache | None,
        ctx: Context,
        model: Model,
        stats: EngineStats,
        *,
        park: bool,
        n_spare: int,
        checkpoint_every: int,
        disk: DiskTier | None = None,
        demand: Demand | None = None,
        shifts: bool = False,
        pool_cells: int | None = None,
    ) -> None:
        self.slots = slots
        self.memory = memory
        self.cache = cache
        self.ctx = ctx
        self.model = model
        self.stats = stats
        self.park = park  # move idle slots to the prompt cache when a request starts
        self.n_spare = n_spare
        self.checkpoint_every = checkpoint_every
        self.disk = disk
        self.demand = demand  # the requests waiting for a slot, the client sessions at work
        self.shifts = shifts  # --cache-reuse is on: each request says how many tokens shifted chunks gave
        # one pool of attention memory with spare sequences (--cache-vram): the cells idle
        # conversations may keep in it beyond the running ones' (None: not that layout)
        self.pool_cells = pool_cells

    def take(self, route: Route, req: GenerateRequest) -> tuple[Reuse, ReusePlan | None]:
        """Bring the route's prefix into the target slot, and say what happened."""
        best = route.seen
        reuse = Reuse(slot=route.target.id, matched=best.matched if best else 0)
        if best is not None:
            reuse.candidate_source = best.source
            reuse.candidate_len = len(best.tokens)
            # described before the prefix is taken, which may cut the candidate's tokens
            if best.matched < min(len(best.tokens), len(req.tokens)):
                self._describe_divergence(reuse, best, req.tokens, req.media)
        # before any cut: its memory becomes a prefix of req's prompt
        route.target.positions, route.target.media = Positions(req.media), tuple(req.media)
        keep, plan = self._take_prefix(route, req)
        reuse.source = route.source if keep else Source.NONE
        reuse.cached = keep
        if self.shifts:  # [plan.keep, keep) came from shifted chunks
            reuse.shifted = plan.shifted if plan is not None and keep else 0
        if plan is not None and keep:
            reuse.restored_checkpoint = plan.restore.n_tokens if plan.restore is not None else None
            reuse.used_logits = plan.logits is not None and keep == len(req.tokens)
            reuse.reason = plan.reason
        else:
            reuse.reason = best.reason if best else ""
        if reuse.matched > 0 and keep == 0:
            self.stats.full_prefills += 1
        route.target.cache_key, route.target.keep_s = req.cache_key, req.keep_s  # it serves req now
        route.target.session = req.session
        return reuse, plan

    def park_idle(self, keep: Slot) -> None:
        """Move the other idle slots' contents to the prompt cache and free their cells.

        NOTE: with a unified KV pool, attention runs over every cell up to the highest one in
        use, so cells that idle slots keep make every running request's decode slower (by
        about a third for one stream next to three idle 16K contexts). An idle slot's contents
        come back from RAM when they are needed again. With spare sequences (recurrent and
        hybrid models on a GPU, whose few attention layers make that cost small) idle
        conversations stay where they are instead."""
        if self.cache is None or not self.park or not self.ctx.unified or (self.n_spare and self.pool_cells is None):
            return
        idle = [s for s in self.slots if s is not keep and s.active is None and s.tokens]
        if self.pool_cells is not None:
            idle = self._over_pool_budget(idle)
        for slot in idle:
            self.memory.save(slot, CopyCause.PARK, keep=0)
            self.memory.clear(slot)
            self.stats.parked += 1

    def _over_pool_budget(self, idle: list[Slot]) -> list[Slot]:
        """The idle slots to move out of the pool so that the cells only idle slots hold
        stay within `pool_cells`, in `_give_up_order`."""
        busy = [s.tokens for s in self.slots if s.active is not None and s.tokens]
        busy_cells = distinct_tokens(busy)
        order = self._give_up_order(idle)
        out = []
        while order and distinct_tokens(busy + [s.tokens for s in order]) - busy_cells > self.pool_cells:
            out.append(order.pop(0))
        return out

    def _give_up_order(self, idle: list[Slot]) -> list[Slot]:
        """Idle slots in the order they give up their contents: those no waiting request
        continues first (least recently used first), then the one the latest waiting request
        continues (see warmslot.cache.lookahead)."""
        demand = self.demand
        uses = slot_uses(idle, demand.waiting() if demand else (), demand.sessions() if demand else ())
        return sorted(idle, key=lambda s: (*give_up_first(uses, s.id), s.last_used))

    def _describe_divergence(self, reuse: Reuse, best, new: list[int], media=(), width: int = 12) -> None:
        """The text around the first differing token: the prompt's own text before and after
        it, and the candidate's text after it only where the prompt holds the candidate's
        whole prompt (it continues that conversation: what differs is the reply the server
        gave it, which the requester already had).

        NOTE: a candidate that diverges inside its own prompt may be another conversation of
        the same tenant (a shared system prompt is enough to match); quoting its text would
        let anyone read other prompts a few tokens at a time. Positions and counts stay.

        An image's run reads `<image HASH>` (a hash of its bytes, as /slots shows it) where
        it is one of the prompt's images, `<image>` otherwise (a clip's, `<audio HASH>`)."""
        at, old = best.matched, best.tokens
        prompt_end = best.prompt_end if best.prompt_end is not None else len(old)
        names = {placeholder_ids(s.chunk.media_id, 1)[0]: f"{s.chunk.kind} {s.chunk.media_id[:16]}" for s in media}

        def text(tokens) -> str:
            out, run = [], []
            for i, t in enumerate(tokens):
                if t >= 0:
                    run.append(t)
                elif i == 0 or tokens[i - 1] >= 0:  # an image's run starts (or the window starts in one)
                    out += [self.model.detokenize(run, special=True), f"<{names[t]}>" if t in names else "<image>"]
                    run = []
            return "".join(out) + self.model.detokenize(run, special=True)

        reuse.context_text = text(new[max(0, at - width) : at])
        reuse.new_text = text(new[at : at + width])
        reuse.old_quoted = at >= prompt_end
        reuse.old_text = text(old[at : at + width]) if reuse.old_quoted else ""

    def _take_prefix(self, route: Route, req: GenerateRequest) -> tuple[int, ReusePlan | None]:
        """Fill the target slot with the route's source, cut back to what the prompt shares.

        The slot's previous contents go into the prompt cache first when the request goes
        elsewhere: when it diverges well before the end of the slot's previous prompt (a
        conversation that only re-renders the tail of the last turn does not pay for a save)."""
        if isinstance(route, Load):
            self.cache.touch(route.entry)
            with self.cache.pinned(route.entry):  # the save below does not evict it
                return self._take_into(route, req)
        return self._take_into(route, req)

    def _take_into(self, route: Route, req: GenerateRequest) -> tuple[int, ReusePlan | None]:
        slot, memory = route.target, self.memory
        if isinstance(route, KeepSlot):
            plan = route.plan  # the router's plan: nothing changed the slot since
            if plan.matched < slot.prompt_end - SAVE_MIN_LOSS:
                # (shifting needs the cells after plan.keep: a save then leaves them all)
                memory.save(slot, CopyCause.OVERWRITE, keep=None if plan.shifts else plan.keep)
            return (memory.shift(slot, plan) if plan.shifts else memory.apply(slot, plan)), plan
        own, donor = self._held_prefix(slot, route.entry if isinstance(route, (Load, FromDisk)) else None)
        if slot.tokens and not (self.ctx.memory_kind.truncatable and held_elsewhere(slot, self.slots, None)):
            # (a cache entry that covers it is checked there); every route below clears the
            # slot, or cuts it back to the prefix it shares with the entry it loads
            memory.save(slot, CopyCause.OVERWRITE, keep=own)
        if isinstance(route, Fork):
            memory.fork(route.donor, slot, route.usable)
        elif isinstance(route, (Load, FromDisk)):
            # a disk entry is loaded through the prompt-cache entry its fetched bytes make
            entry = route.entry if isinstance(route, Load) else self.disk.take(route)
            if entry is None:
                memory.clear(slot)
                return 0, None
            keep = self._prefix_for_load(slot, own, donor)
            while self._cells_in_use() + len(entry) - keep > self.ctx.n_ctx and self.evict_idle(exclude=slot):
                pass
            while not memory.load(entry, slot, keep=min(keep, slot.n_past)):
                if not self.evict_idle(exclude=slot):
                    memory.clear(slot)
                    return 0, None
            if isinstance(route, Load):
                self.cache.stats.hits += 1
        else:
            memory.clear(slot)
            if self.cache is not None:
                self.cache.stats.misses += 1
            return 0, None
        plan = memory.plan(slot, req.tokens)
        return memory.apply(slot, plan), plan

    def _held_prefix(self, slot: Slot, entry) -> tuple[int, tuple[Slot, int] | None]:
        """Where a load of `entry` into `slot` may write only a tail (SlotMemory.tail_loads):
        how many of the entry's first tokens the slot holds (0: fewer than TAIL_LOAD_MIN),
        and another slot of the entry's tenant that holds at least TAIL_LOAD_MIN more (the
        one holding the most) with that count, whose cells a fork shares (None: none)."""
        if entry is None or not self.memory.tail_loads():
            return 0, None
        tokens = entry.tokens

        def exact(holder: Slot) -> int:  # shifted chunks (--cache-reuse) are not a cold run's cells
            n = min(common_prefix(holder.tokens, tokens), len(tokens) - 1)
            return n if holder.approx_from is None else min(n, holder.approx_from)

        own = exact(slot) if slot.tenant == entry.tenant else 0
        best = None
        for other in self.slots:
            if other is slot or other.tenant != entry.tenant or not other.positions.same or not other.tokens:
                continue
            n = exact(other)
            if n >= own + TAIL_LOAD_MIN and (best is None or n > best[1]):
                best = (other, n)
        return (own if own >= TAIL_LOAD_MIN else 0), best

    def _prefix_for_load(self, slot: Slot, own: int, donor: tuple[Slot, int] | None) -> int:
        """Bring the slot to the prefix its load keeps: the slot's own first `own` tokens
        (cut back to them), else a fork of another slot's (in one pool a fork shares the
        cells). Returns the tokens the slot then holds of the entry (0: none, it is empty)."""
        memory = self.memory
        if donor is not None:
            memory.fork(donor[0], slot, donor[1])
            self.stats.tail_load_forks += 1
            return donor[1]
        if own and memory.cut(slot, own):
            return own
        memory.clear(slot)
        return 0

    def _cells_in_use(self) -> int:
        """KV cells the slots hold, for the room a load needs. Where loads write tails (one
        pool, attention) a prefix that slots share is counted once, as forks share its
        cells (an underestimate where two slots computed it apart: a load then finds no
        room and evicts, as below); elsewhere every slot's tokens (an overestimate)."""
        if not self.memory.tail_loads():
            return sum(s.n_past for s in self.slots)
        return distinct_tokens([s.tokens for s in self.slots if s.tokens])

    def cuts(self, req: GenerateRequest, keep: int) -> list[int]:
        """Prompt positions (after keep, before the end) where a checkpoint is taken: the
        request's boundaries, the end of each image (a prompt that leaves this one in the text
        after an image must not decode the image again) and every --checkpoint-every tokens."""
        if self.ctx.memory_kind.truncatable:
            return []
        n = len(req.tokens)
        every = self.checkpoint_every
        cuts = {b for b in (*req.boundaries, *(span.end for span in req.media)) if keep < b < n}
        if every > 0:
            first = (keep // every + 1) * every
            cuts.update(range(first, n, every))
        return sorted(cuts)

    def evict_idle(self, exclude: Slot | None = None) -> bool:
        """Make room in the KV pool: move an idle slot's contents to the prompt cache and
        clear it: one that no waiting request continues, least recently used first (else the
        one the latest waiting request continues). False when no idle slot holds anything."""
        if not self.ctx.unified:
            return False  # each slot has a stream of its own: clearing another frees nothing
        idle = [s for s in self.slots if s.active is None and s.tokens and s is not exclude]
        if not idle:
            return False
        victim = self._give_up_order(idle)[0]
        log.info("slot %d: KV pool full; moving this idle slot's %d tokens to the prompt cache", victim.id, victim.n_past)
        self.memory.save(victim, CopyCause.SPILL, keep=0)
        self.memory.clear(victim)
        self.stats.kv_evictions += 1
        return True
