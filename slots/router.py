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
carries exactly what applying it needs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence, Union

from warmslot.cache.disk import DiskEntry
from warmslot.cache.lookahead import give_up_first, next_uses, session_uses
from warmslot.cache.entries import CacheEntry
from warmslot.cache.prompt_cache import PromptCache

from .disk_tier import DiskTier
from .requests import GenerateRequest, Source
from .reuse import ReusePlan, common_prefix, plan_reuse
from .slot import Slot

# a prefix this long, being computed by another slot right now, is worth waiting for
MIN_SHARED_TO_WAIT = 32
# an idle stream apart from the busy ones is used for a shorter prefix only when no stream
# next to them can take the request (see Router._apart). An estimate, not a measurement:
# an 8B model on a GPU prefills 256 tokens in about the time of ten steps' extra
# micro-batches, and a request runs for more steps than that
APART_MIN_KEEP = 256

_RANK = {Source.SLOT: 3, Source.FORK: 2, Source.RAM: 1, Source.DISK: 0}


@dataclass(frozen=True, slots=True)
class Candidate:
    """The candidate sharing the longest prefix with a prompt, usable or not (diagnostics)."""

    source: Source
    matched: int
    tokens: Sequence[int]
    usable: int
    reason: str = ""
    # where the prompt that produced `tokens` ended (what follows is its generated reply);
    # unknown: len(tokens). Text before it is quoted to no one (see Prefixes.take)
    prompt_end: int | None = None


@dataclass(frozen=True, slots=True)
class KeepSlot:
    """The target already holds the prefix: apply `plan` to it."""

    target: Slot
    plan: ReusePlan
    seen: Candidate | None = None
    source = Source.SLOT

    @property
    def usable(self) -> int:
        return self.plan.keep


@dataclass(frozen=True, slots=True)
class Fork:
    """Copy `donor`'s sequence into the target on the device; `usable` tokens are kept."""

    target: Slot | None
    donor: Slot
    usable: int
    seen: Candidate | None = None
    source = Source.FORK


@dataclass(frozen=True, slots=True)
class Load:
    """Copy a prompt-cache entry into the target; `usable` tokens are kept."""

    target: Slot | None
    entry: CacheEntry
    usable: int
    seen: Candidate | None = None
    source = Source.RAM


@dataclass(frozen=True, slots=True)
class FromDisk:
    """Load a disk entry, whose bytes are in memory now, into the target; `usable` tokens
    are kept. `cost`: the read's price in tokens (ranking only)."""

    target: Slot | None
    entry: DiskEntry
    usable: int
    seen: Candidate | None = None
    cost: float = 0.0
    need: frozenset[int] = frozenset()  # positions of the entry's checkpoints the load uses
    source = Source.DISK


@dataclass(frozen=True, slots=True)
class Fetch:
    """Not now: the best source is a disk entry that is being read; the request waits for it
    and lets later requests go first."""

    entry: DiskEntry
    need: frozenset[int] = frozenset()  # positions of the entry's checkpoints to read


@dataclass(frozen=True, slots=True)
class Fresh:
    """Nothing to reuse: the target starts empty."""

    target: Slot
    seen: Candidate | None = None
    source = Source.NONE
    usable = 0


@dataclass(frozen=True, slots=True)
class Wait:
    """Not now: no idle slot, or `for_slot` is about to compute `shared` prompt tokens."""

    for_slot: Slot | None = None
    shared: int = 0


Route = Union[KeepSlot, Fork, Load, FromDisk, Fresh, Fetch, Wait]


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
    ) -> None:
        self.slots = slots
        self.cache = cache
        self.cutter = cutter
        self.truncatable = truncatable
        self.can_fork = can_fork
        # at most this many sequences run requests; the others only keep their contents
        self.n_busy_max = len(slots) if n_busy_max is None else n_busy_max
        self.contiguous = contiguous  # keep busy ids in one run (a KV stream per sequence)
        self.disk = disk
        self.quick_tokens = quick_tokens  # see the module: 0, none run beside n_busy_max
        # the requests waiting for a slot, next first (the engine's queue): which idle slot
        # gives up its contents (see warmslot.cache.lookahead)
        self.waiting: Callable[[], Iterable[GenerateRequest]] = tuple
        self.sessions: Callable[[], Iterable[tuple[str, str]]] = tuple  # client sessions at work (sessions.py)

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
            free = not route.target.tokens or held_elsewhere(route.target, self.slots, self.cache)
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
            if not self.disk.ready(best.entry, best.need):
                return Fetch(best.entry, best.need)
            return FromDisk(self._receiver(idle, None, req), best.entry, best.usable, seen, best.cost, best.need)
        return Load(self._receiver(idle, None, req), best.entry, best.usable, seen)

    def _best(self, req: GenerateRequest) -> tuple[KeepSlot | Fork | Load | FromDisk | None, Candidate | None]:
        """The source that keeps the most of the prompt, and the candidate that shared the
        most with it (for the miss explanation), over the tenant's slots and cache entries."""
        prompt = req.tokens
        best: KeepSlot | Fork | Load | FromDisk | None = None
        seen: Candidate | None = None

        def consider(route, candidate: Candidate) -> None:
            nonlocal best, seen
            if seen is None or (candidate.matched, candidate.usable) > (seen.matched, seen.usable):
                seen = candidate
            if route is not None and (best is None or (_score(route), _RANK[route.source]) > (_score(best), _RANK[best.source])):
                best = route

        # on ties the slot that last served the request's prompt_cache_key comes first
        for slot in sorted(self.slots, key=lambda s: not _affine(s, req)):
            if slot.tenant != req.tenant or not slot.tokens:
                continue
            plan = plan_reuse(slot.tokens, slot.checkpoints, prompt, self.cutter(slot))
            source = Source.SLOT if slot.active is None else Source.FORK
            candidate = Candidate(source, plan.matched, slot.tokens, plan.keep, plan.reason, slot.prompt_end or None)
            if slot.active is None:
                consider(KeepSlot(slot, plan), candidate)
            # a fork that needs neither a cut nor a restore in the target is safe everywhere
            if plan.keep > 0 and (self.can_fork or (plan.restore is None and plan.keep == slot.n_past)):
                consider(Fork(None, slot, plan.keep), candidate)
        if self.cache is not None:
            self._consider_cache(req, consider)
        if self.disk is not None:
            self._consider_disk(req, consider)
        return best, seen

    def _consider_cache(self, req: GenerateRequest, consider) -> None:
        """The cache's best entry, or the entry that shared the most (unusable, for the
        explanation), or a recently evicted entry that would have served."""
        lookup = self.cache.lookup(req.tokens, req.tenant, self._entry_usable(req.tokens))
        if lookup.best is not None:
            e = lookup.best
            consider(Load(None, e.entry, e.usable), Candidate(Source.RAM, e.matched, e.entry.tokens, e.usable, "", e.entry.prompt_end))
        elif lookup.closest is not None:
            e = lookup.closest
            consider(None, Candidate(Source.RAM, e.matched, e.entry.tokens, 0,
                                     "the prompt cache entry has no checkpoint at or before the divergence", e.entry.prompt_end))
        if lookup.evicted is not None:
            matched, tokens = lookup.evicted
            consider(None, Candidate(Source.EVICTED, matched, tokens, 0,
                                     f"a prompt-cache entry sharing {matched} tokens was evicted (raise --cache-ram)"))

    def _consider_disk(self, req: GenerateRequest, consider) -> None:
        """The disk's best entry priced by its read, or what explains a disk miss: the entry
        sharing the most, or one that was rejected."""
        lookup = self.disk.lookup(req.tokens, req.tenant, self._entry_usable(req.tokens))
        if lookup.best is not None:
            e = lookup.best
            need = e.entry.needed(e.usable, len(req.tokens))
            cost = self.disk.cost_tokens(e.entry, need)
            if e.usable - cost > 0:
                consider(FromDisk(None, e.entry, e.usable, cost=cost, need=need), Candidate(Source.DISK, e.matched, e.entry.tokens, e.usable))
            else:
                consider(None, Candidate(Source.DISK, e.matched, e.entry.tokens, 0,
                                         f"computing {e.usable} tokens is faster than reading their {e.entry.bytes_for(need)} bytes from disk"))
        elif lookup.closest is not None:
            e = lookup.closest
            consider(None, Candidate(Source.DISK, e.matched, e.entry.tokens, 0,
                                     "the disk entry has no checkpoint at or before the divergence"))
        if lookup.rejected is not None:
            matched, tokens, reason = lookup.rejected
            consider(None, Candidate(Source.DISK, matched, tokens, 0,
                                     f"a disk entry sharing {matched} tokens was rejected ({reason})"))

    def _entry_usable(self, prompt: Sequence[int]) -> Callable[[CacheEntry | DiskEntry, int], int]:
        # after a load the memory ends at the entry's end; only attention memory can be cut
        # anywhere (an SWA window position is unknown until the load, so be strict)
        can_cut = (lambda n: True) if self.truncatable else (lambda n: False)

        def usable(entry: CacheEntry | DiskEntry, matched: int) -> int:
            return plan_reuse(entry.tokens, entry.checkpoints, prompt, can_cut).keep

        return usable

    def _worth_waiting(self, req: GenerateRequest, usable: int) -> Wait | None:
        """A slot now prefilling a prompt that shares a long prefix with `req` beyond what
        is usable elsewhere: waiting for it beats computing the same tokens twice."""
        for slot in self.slots:
            active = slot.active
            if active is None or active.prefill_done or slot.tenant != req.tenant:
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

    def _closer(self, idle: list[Slot]) -> Slot | None:
        """An idle stream inside or next to the run of busy ones that is free to take a
        conversation from a stream apart from them: empty, or all it holds is held elsewhere
        (`held_elsewhere`), so nothing crosses to RAM. A fork between streams copies the
        whole stream on the device (milliseconds on a GPU); the stream left keeps its copy
        until it is needed."""
        run = self._run()
        if run is None or not (self.truncatable and self.can_fork):
            return None
        free = [s for s in idle if run[0] <= s.id <= run[1] and (not s.tokens or held_elsewhere(s, self.slots, self.cache))]
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

        affine = [s for s in pool if _affine(s, req)]
        if affine:
            return max(affine, key=lambda s: s.last_used)
        empty = [s for s in pool if not s.tokens]
        if empty:
            return min(empty, key=lambda s: (distance(s), s.id))
        uses = slot_uses(pool, self.waiting(), self.sessions(), skip=req)

        def cost(slot: Slot) -> tuple:
            # nothing to save when another stream or the cache holds it all (a copy left by
            # a move next to the busy streams: the waiting request it serves goes there)
            free = self.truncatable and held_elsewhere(slot, self.slots, self.cache)
            return (not free, *give_up_first(uses, slot.id), distance(slot), slot.last_used)

        return min(pool, key=cost)


def slot_uses(slots: Sequence[Slot], waiting: Sequence[GenerateRequest], running: Iterable[tuple[str, str]],
              skip: GenerateRequest | None = None) -> dict[int, int]:
    """For each slot (by id) that a waiting request continues, that request's place in the
    queue, and after those the slots of client sessions at work (`running`: tenant, session;
    see sessions.py) or waiting (see warmslot.cache.lookahead): what the queue will want
    soonest stays. `skip`: the request being placed, which counts as running."""
    upcoming = [r for r in waiting if r is not skip]
    uses = next_uses(((s.id, s.tenant, s.tokens, s.prompt_end or None) for s in slots), ((r.tenant, r.tokens) for r in upcoming))
    running = [*running, *([(skip.tenant, skip.session)] if skip is not None else [])]
    return session_uses(((s.id, s.tenant, s.session) for s in slots), running, ((r.tenant, r.session) for r in upcoming), uses)



def held_elsewhere(slot: Slot, slots: Sequence[Slot], cache: PromptCache | None) -> bool:
    """Everything the slot holds is also held by another slot of its tenant (whose tokens
    start with all of its own), or by a prompt-cache entry: on memory that can be cut
    back anywhere, its contents can go without a save."""
    tokens = slot.tokens
    n = len(tokens)
    for other in slots:
        if other is not slot and other.tenant == slot.tenant and len(other.tokens) >= n \
                and (n == 0 or other.tokens[n - 1] == tokens[-1]) and other.tokens[:n] == tokens:
            return True
    return cache is not None and cache.find_covering(tokens, slot.tenant) is not None


def _score(route) -> float:
    """A route's usable prefix, less what reading it costs (disk), in tokens."""
    return route.usable - getattr(route, "cost", 0.0)


def _affine(slot: Slot, req: GenerateRequest) -> bool:
    """The slot last served the request's prompt_cache_key (within its tenant)."""
    return bool(req.cache_key) and slot.cache_key == req.cache_key and slot.tenant == req.tenant


def _may_hold(slot: Slot, req: GenerateRequest, need: int) -> bool:
    """Whether `slot` may hold the prompt's first `need` tokens: a check of two tokens, so
    that a full queue is not routed again at every step."""
    tokens = slot.tokens
    return slot.tenant == req.tenant and len(tokens) >= need and tokens[0] == req.tokens[0] and tokens[need - 1] == req.tokens[need - 1]
