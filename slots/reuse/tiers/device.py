"""The device tier: what the slots' sequences hold, on the device (the fastest tier).

An idle slot's contents serve a prompt where they are (`KeepSlot`), and any slot's, busy or
idle, can be copied into another slot with `seq_cp` (`Fork`; on non-truncatable memory only
up to one of its checkpoints or its end). The state never leaves the device: `take` names
the slot that holds it, and `Prefixes` applies the route. The device takes a conversation
only through a route into a slot, so `put` keeps nothing.
"""

from __future__ import annotations

from typing import Callable, Sequence

from warmslot.cache.entries import CacheEntry
from warmslot.cache.prompt_cache import PromptCache

from ...requests import GenerateRequest, Source
from ..plan import plan_reuse, with_shifts
from ...slot import Slot
from ...stats import EngineStats
from .base import Found, Release, TierCounters, TierMatch
from .routes import Candidate, Fork, KeepSlot, Offer


class DeviceTier:
    source = Source.SLOT

    def __init__(self, slots: Sequence[Slot], cutter: Callable[[Slot], Callable[[int], bool]], can_fork: bool,
                 cache: PromptCache | None = None, stats: EngineStats | None = None, shift_min: int = 0) -> None:
        self.slots = slots
        self.cutter = cutter  # whether a slot's memory can be cut back to n tokens
        self.can_fork = can_fork
        self.cache = cache  # what `held_elsewhere` also looks in
        self.stats = stats
        # --cache-reuse where the memory can shift (0: off): an idle slot's chunks of at least
        # this many tokens that the prompt has further on move to follow its exact prefix
        self.shift_min = shift_min

    def match(self, req: GenerateRequest) -> TierMatch:
        """For each slot of the tenant holding tokens (the one that last served the request's
        prompt_cache_key first): a `KeepSlot` if it is idle, a `Fork` if its contents can
        be copied. Read-only."""
        found = []
        for slot in sorted(self.slots, key=lambda s: not affine(s, req)):
            if slot.tenant != req.scope or not slot.tokens:
                continue
            plan = plan_reuse(slot.tokens, slot.checkpoints, req.tokens, self.cutter(slot))
            source = Source.SLOT if slot.active is None else Source.FORK
            candidate = Candidate(source, plan.matched, slot.tokens, plan.keep, plan.reason, slot.prompt_end or None)
            if slot.active is None:
                found.append(Found(KeepSlot(slot, self._with_shifts(slot, plan, req)), candidate))
            if plan.keep > 0 and self._forkable(slot, plan):
                found.append(Found(Fork(None, slot, plan.keep), candidate))
        return TierMatch(tuple(found))

    def _with_shifts(self, slot: Slot, plan, req: GenerateRequest):
        """The plan with the chunks of the slot that the prompt has further on (see
        plan.with_shifts); not where a prompt or the slot holds images, whose positions are
        not the token indices."""
        if not self.shift_min or req.media or slot.media:
            return plan
        return with_shifts(plan, slot.tokens, req.tokens, self.shift_min)

    def _forkable(self, slot: Slot, plan) -> bool:
        """A fork that needs neither a cut nor a restore in the target is safe everywhere."""
        return self.can_fork or (plan.restore is None and plan.keep == slot.n_past)

    def ready(self, offer: Offer) -> bool:
        """Always: the state is on the device."""
        return True

    def take(self, offer: Offer) -> Slot:
        """The slot holding the offer's state: the target kept, or the donor copied.
        Read-only."""
        return offer.donor if isinstance(offer, Fork) else offer.target

    def put(self, entry: CacheEntry) -> bool:
        """Keeps nothing: a conversation reaches the device through a route into a slot
        (`Load`, `FromDisk`), applied by `Prefixes`."""
        return False

    def give_up(self) -> list[Release]:
        """The idle slots holding tokens: those whose contents another slot or the RAM cache
        also holds first (losing them costs nothing), then least recently used first.
        Read-only."""
        idle = [s for s in self.slots if s.active is None and s.tokens]
        free = {s.id for s in idle if self.held_elsewhere(s)}
        idle.sort(key=lambda s: (s.id not in free, s.last_used))
        return [Release(s, s.n_past, None, 0 if s.id in free else s.n_past) for s in idle]

    def held_elsewhere(self, slot: Slot) -> bool:
        """See `held_elsewhere`. Read-only."""
        return held_elsewhere(slot, self.slots, self.cache)

    def counters(self) -> TierCounters:
        """The idle slots holding tokens, the prompt tokens slots and forks served, and the
        idle slots moved out because the KV pool was full. Read-only."""
        held = sum(1 for s in self.slots if s.active is None and s.tokens)
        st = self.stats
        served = st.prompt_tokens["slot"] + st.prompt_tokens["fork"] + st.prompt_tokens["shifted"] if st is not None else 0
        return TierCounters(self.source, held, None, None, st.kv_evictions if st is not None else 0, served)


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


def affine(slot: Slot, req: GenerateRequest) -> bool:
    """The slot last served the request's prompt_cache_key (within its tenant)."""
    return bool(req.cache_key) and slot.cache_key == req.cache_key and slot.tenant == req.scope
