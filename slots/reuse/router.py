"""Routing: which slot serves a new request, and where its prefix comes from.

Sources, by how many prompt tokens a slot keeps after using them:
- **slot**: an idle slot's own contents (nothing copied);
- **fork**: another slot's contents, copied with llama.cpp's `seq_cp` (on the device), busy
  or idle; on non-truncatable memory only up to one of its checkpoints or its end;
- **ram**: a prompt-cache entry, copied from RAM;
- **disk**: a disk-tier entry, read from its file first (`Fetch`: the request waits while
  a reader thread reads it), then loaded like a RAM entry.

The longest usable prefix wins; ties prefer slot, then fork, then ram, then disk. A disk
candidate counts its usable prefix minus the price of reading it, in tokens the same time
would compute (`DiskTier.cost_tokens`). A cache load or a fork goes into the idle slot
that last served the request's `prompt_cache_key`, else an empty one, else one whose
contents no waiting request continues, least recently used first (the queue says what is
needed next: see warmslot.cache.lookahead). A busy slot is never taken. A request whose prefix another slot is about
to compute waits for it (`Wait`).

While `n_busy_max` requests run, a request waits, unless it is **quick**: with a stream per
sequence, it continues a conversation that an idle sequence on the device holds (or that a
move next to the busy streams copies there), and computes at most `quick_tokens` new
tokens. Such a request runs beside the others, up to twice `n_busy_max` in all: it takes no
memory another request could use and no copy through RAM, and costs the steps it shares a
few hundred tokens, where waiting for a slot would cost it other conversations' whole
prefills.

A route is one of `KeepSlot`, `Fork`, `Load`, `FromDisk`, `Fresh`, `Fetch` or `Wait`: each
carries exactly what applying it needs (tiers/routes.py).

The sources are three tiers behind one interface (`Tier`, tiers/base.py), asked in order:
the device's sequences (`DeviceTier`: keep or fork), the RAM prompt cache (`RamTier`: load)
and the disk (`DiskTier`: fetch, then load). Each answers `match` with its offers and the
candidates that explain a miss; the router weighs them all and names the slot.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Sequence

from warmslot.cache.demand import Demand
from warmslot.cache.lookahead import give_up_first, next_uses, session_uses
from warmslot.cache.prompt_cache import PromptCache

from ..requests import GenerateRequest, Source
from .plan import common_prefix
from ..slot import Slot
from ..stats import EngineStats
from .tiers.base import Tier
from .tiers.device import DeviceTier, affine, held_elsewhere
from .tiers.disk import DiskTier
from .tiers.ram import RamTier
from .tiers.routes import Candidate, Fetch, Fork, Fresh, FromDisk, KeepSlot, Load, Route, Wait, score

__all__ = ["Candidate", "Fetch", "Fork", "Fresh", "FromDisk", "KeepSlot", "Load", "Route", "Router", "Wait",
           "held_elsewhere", "slot_uses"]

# a prefix this long, being computed by another slot right now, is worth waiting for
MIN_SHARED_TO_WAIT = 32
# an idle stream apart from the busy ones is used for a shorter prefix only when no stream
# next to them can take the request (see Router._apart). An estimate, not a measurement:
# an 8B model on a GPU prefills 256 tokens in about the time of ten steps' extra
# micro-batches, and a request runs for more steps than that
APART_MIN_KEEP = 256

_RANK = {Source.SLOT: 3, Source.FORK: 2, Source.RAM: 1, Source.DISK: 0}


class Router:
    def __init__(
        self,
        slots: Sequence[Slot],
        cache: PromptCache | None,
        cutter: Callable[[Slot], Callable[[int], bool]],
        truncatable: bool,
        can_fork: bool = True,
        n_busy_max: int | None = None,
        contiguous: bool = False,
        disk: DiskTier | None = None,
        quick_tokens: int = 0,
        stats: EngineStats | None = None,
        demand: Demand | None = None,
        shift_min: int = 0,
    ) -> None:
        """`shift_min`: --cache-reuse's chunk size where the memory can shift, else 0 (off)."""
        self.slots = slots
        self.cache = cache
        self.cutter = cutter
        self.truncatable = truncatable
        self.can_fork = can_fork
        # at most this many sequences run requests; the others only keep their contents
        self.n_busy_max = len(slots) if n_busy_max is None else n_busy_max
        self.contiguous = contiguous  # keep busy ids in one run (a KV stream per sequence)
        self.disk = disk
        self.device = DeviceTier(slots, cutter, can_fork, cache, stats, shift_min)
        self.ram = RamTier(cache, truncatable, stats) if cache is not None else None
        # asked in this order; on equal scores the earlier source wins (_RANK)
        self.tiers: tuple[Tier, ...] = tuple(t for t in (self.device, self.ram, disk) if t is not None)
        self.quick_tokens = quick_tokens  # see the module: 0, none run beside n_busy_max
        # the requests waiting for a slot, next first (the engine's queue), and the client
        # sessions at work: which idle slot gives up its contents (see warmslot.cache.lookahead)
        self.demand = demand

    def route(self, req: GenerateRequest) -> Route:
        """Decide where `req` goes. Read-only: applying the route is the engine's job."""
        idle = [s for s in self.slots if s.active is None]
        if self.saturated():
            return self._quick(req, idle) or Wait()
        return self._place(req, idle)

    def saturated(self) -> bool:
        """Whether `n_busy_max` requests run: a request starts now only as a quick one."""
        return self._n_busy() >= self.n_busy_max

    def _n_busy(self) -> int:
        return sum(1 for s in self.slots if s.active is not None)

    def quick_room(self) -> bool:
        """Whether a quick request could start now that `n_busy_max` run (see the module)."""
        if not self.quick_tokens or not self.contiguous:  # in one pool it would take cells the others count on
            return False
        return self.n_busy_max <= self._n_busy() < min(len(self.slots), 2 * self.n_busy_max)

    def _quick(self, req: GenerateRequest, idle: list[Slot]) -> KeepSlot | Fork | None:
        """The route of a quick request (see the module), else None. An idle sequence must
        hold all but `quick_tokens` of the prompt before the whole routing runs."""
        if not self.quick_room() or not req.reuse_prefix or not req.tokens:
            return None
        need = max(1, len(req.tokens) - self.quick_tokens)
        if not any(_may_hold(s, req, need) for s in idle):
            return None
        route = self._place(req, idle)
        if isinstance(route, Fork):
            free = not route.target.tokens or self.device.held_elsewhere(route.target)
            if route.donor.active is not None or not free:
                return None  # a busy donor's copy, or a save to make room: not quick
        if isinstance(route, (KeepSlot, Fork)) and route.usable >= need:
            return route
        return None

    def _place(self, req: GenerateRequest, idle: list[Slot]) -> Route:
        """The route of `req` among the idle sequences (see `route`)."""
        if not req.reuse_prefix:
            return Fresh(self._receiver(idle, None, req))
        best, seen = self._best(req)
        waiting = self._worth_waiting(req, best.usable if best else 0)
        if waiting is not None:
            return waiting
        if best is None or best.usable == 0:
            return Fresh(self._receiver(idle, None, req), seen)
        if isinstance(best, KeepSlot):
            spare = self._spare_in_pool(best, idle)
            if spare is not None:  # the slot's conversation stays where it is
                return Fork(spare, best.target, best.plan.keep, seen)
            if self._apart(best.target):
                closer = self._closer(idle)
                if closer is not None:  # a device copy next to the busy streams beats a gap in them
                    return Fork(closer, best.target, best.plan.keep, seen)
                if best.plan.keep < APART_MIN_KEEP:  # a few shared tokens are not worth a gap
                    receiver = self._receiver(idle, None, req)
                    if receiver is not best.target:
                        why = f"{best.plan.keep} shared tokens in stream {best.target.id}, apart from the busy streams: computed next to them instead"
                        return Fresh(receiver, dataclasses.replace(seen, reason=why) if seen is not None else None)
            return KeepSlot(best.target, best.plan, seen)
        if isinstance(best, Fork):
            return Fork(self._receiver(idle, best.donor, req), best.donor, best.usable, seen)
        if isinstance(best, FromDisk):
            if not self.disk.ready(best):
                return Fetch(best.entry, best.need)
            return FromDisk(self._receiver(idle, None, req), best.entry, best.usable, seen, best.cost, best.need)
        return Load(self._receiver(idle, None, req), best.entry, best.usable, seen)

    def _best(self, req: GenerateRequest) -> tuple[KeepSlot | Fork | Load | FromDisk | None, Candidate | None]:
        """The source that keeps the most of the prompt, and the candidate that shared the
        most with it (for the miss explanation), over what the tiers hold for the tenant."""
        best: KeepSlot | Fork | Load | FromDisk | None = None
        seen: Candidate | None = None

        def consider(route, candidate: Candidate) -> None:
            nonlocal best, seen
            if seen is None or (candidate.matched, candidate.usable) > (seen.matched, seen.usable):
                seen = candidate
            if route is not None and (best is None or (score(route), _RANK[route.source]) > (score(best), _RANK[best.source])):
                best = route

        for tier in self.tiers:
            for found in tier.match(req).found:
                consider(found.offer, found.candidate)
        return best, seen

    def _worth_waiting(self, req: GenerateRequest, usable: int) -> Wait | None:
        """A slot now prefilling a prompt that shares a long prefix with `req` beyond what
        is usable elsewhere: waiting for it beats computing the same tokens twice."""
        for slot in self.slots:
            active = slot.active
            if active is None or active.prefill_done or slot.tenant != req.scope:
                continue
            if active.req.id == req.sibling_of:
                # another choice of the same prompt: fork it once it is complete (its
                # end-of-prompt checkpoint keeps the logits, so the fork evaluates nothing)
                return Wait(slot, 0)
            shared = min(common_prefix(active.prompt, req.tokens), len(req.tokens) - 1)
            if shared >= usable + MIN_SHARED_TO_WAIT and slot.n_past < shared:
                return Wait(slot, shared)
        return None

    def _run(self) -> tuple[int, int] | None:
        """The ids from just before the first busy stream to just after the last (None: no
        busy stream, or one pool)."""
        busy = [s.id for s in self.slots if s.active is not None] if self.contiguous else []
        return (min(busy) - 1, max(busy) + 1) if busy else None

    def _apart(self, slot: Slot) -> bool:
        """With a stream per sequence: running a request in `slot` would leave a gap among
        the busy streams.

        NOTE: llama.cpp decodes a batch over streams in micro-batches of consecutive ids, so
        a request in a stream away from the busy ones costs every step a micro-batch more
        (another pass over the weights) or filler tokens, for as long as it runs. On an H200
        with 16 slots, a run whose busy streams scattered that way (895 filler tokens against
        none) spent three times as long in decode calls for the same tokens."""
        run = self._run()
        return run is not None and not run[0] <= slot.id <= run[1]

    def _spare_in_pool(self, best: KeepSlot, idle: list[Slot]) -> Slot | None:
        """In one pool with spare sequences: an empty idle sequence to fork the kept prefix
        into where keeping it in `best.target` would cut off at least MIN_SHARED_TO_WAIT
        tokens of another conversation that nothing else holds. In one pool a fork shares
        the prefix's cells (a hybrid's recurrent state is copied, and the fork's plan restores
        the checkpoint that the kept prefix ends on), so that conversation stays on the device
        instead of crossing to RAM (None: keep the slot)."""
        target = best.target
        if self.contiguous or len(self.slots) <= self.n_busy_max or best.plan.shifts \
                or not self.can_fork or target.n_past - best.plan.keep < MIN_SHARED_TO_WAIT \
                or self.device.held_elsewhere(target):
            return None
        empty = [s for s in idle if not s.tokens]
        return min(empty, key=lambda s: s.id) if empty else None

    def _closer(self, idle: list[Slot]) -> Slot | None:
        """An idle stream inside or next to the run of busy ones that is free to take a
        conversation from a stream apart from them: empty, or all it holds is held elsewhere
        (`held_elsewhere`), so nothing crosses to RAM. A fork between streams copies the
        whole stream on the device (milliseconds on a GPU); the stream left keeps its copy
        until it is needed."""
        run = self._run()
        if run is None or not (self.truncatable and self.can_fork):
            return None
        free = [s for s in idle if run[0] <= s.id <= run[1] and (not s.tokens or self.device.held_elsewhere(s))]
        return min(free, key=lambda s: (s.n_past, s.id)) if free else None

    def _receiver(self, idle: list[Slot], exclude: Slot | None, req: GenerateRequest) -> Slot:
        """The idle slot that last served the request's prompt_cache_key, else an empty one,
        else one whose contents another stream or the cache holds, else one whose contents no
        waiting request continues (else the one the latest waiting request continues), least
        recently used first (not the donor, if possible); among equals, the one nearest to
        the busy slots' ids.

        NOTE: with a KV stream per sequence, busy sequences whose ids form one run decode in
        one micro-batch; a gap costs a micro-batch more or filler tokens (see scheduler)."""
        pool = [s for s in idle if s is not exclude] or idle
        run = self._run()

        def distance(slot: Slot) -> int:
            return 0 if run is None else max(run[0] - slot.id, slot.id - run[1], 0)

        served = [s for s in pool if affine(s, req)]
        if served:
            return max(served, key=lambda s: s.last_used)
        empty = [s for s in pool if not s.tokens]
        if empty:
            return min(empty, key=lambda s: (distance(s), s.id))
        demand = self.demand
        uses = slot_uses(pool, demand.waiting() if demand else (), demand.sessions() if demand else (), skip=req)

        def cost(slot: Slot) -> tuple:
            # nothing to save when another stream or the cache holds it all (a copy left by
            # a move next to the busy streams: the waiting request it serves goes there)
            free = self.truncatable and self.device.held_elsewhere(slot)
            return (not free, *give_up_first(uses, slot.id), distance(slot), slot.last_used)

        return min(pool, key=cost)


def slot_uses(slots: Sequence[Slot], waiting: Sequence[GenerateRequest], running: Iterable[tuple[str, str]],
              skip: GenerateRequest | None = None) -> dict[int, int]:
    """For each slot (by id) that a waiting request continues, that request's place in the
    queue, and after those the slots of client sessions at work (`running`: tenant, session;
    see sessions.py) or waiting (see warmslot.cache.lookahead): what the queue will want
    soonest stays. `skip`: the request being placed, which counts as running."""
    upcoming = [r for r in waiting if r is not skip]
    uses = next_uses(((s.id, s.tenant, s.tokens, s.prompt_end or None) for s in slots), ((r.scope, r.tokens) for r in upcoming))
    running = [*running, *([(skip.scope, skip.session)] if skip is not None else [])]
    return session_uses(((s.id, s.tenant, s.session) for s in slots), running, ((r.scope, r.session) for r in upcoming), uses)



def _may_hold(slot: Slot, req: GenerateRequest, need: int) -> bool:
    """Whether `slot` may hold the prompt's first `need` tokens: a check of two tokens, so
    that a full queue is not routed again at every step."""
    tokens = slot.tokens
    return slot.tenant == req.scope and len(tokens) >= need and tokens[0] == req.tokens[0] and tokens[need - 1] == req.tokens[need - 1]
