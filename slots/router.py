"""Routing: which slot serves a new request, and where its prefix comes from.

Sources, by how many prompt tokens a slot keeps after using them:
- **slot**: an idle slot's own contents (nothing copied);
- **fork**: another slot's contents, copied with llama.cpp's `seq_cp` (on the GPU), busy
  or idle; on non-truncatable memory only up to one of its checkpoints or its end;
- **ram**: a prompt-cache entry, copied from RAM.

The longest usable prefix wins; ties prefer slot, then fork, then ram. A cache load or a
fork goes into an empty idle slot, else the least recently used one. A busy slot is never
taken. A request whose prefix another slot is about to compute waits for it (see `defer`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from warmslot.cache.prompt_cache import CacheEntry, PromptCache

from .requests import GenerateRequest
from .reuse import ReusePlan, common_prefix, plan_reuse
from .slot import Slot

# a prefix this long, being computed by another slot right now, is worth waiting for
MIN_SHARED_TO_WAIT = 32

_RANK = {"slot": 2, "fork": 1, "ram": 0}


@dataclass(slots=True)
class Candidate:
    """The candidate sharing the longest prefix with a prompt, usable or not (diagnostics)."""

    source: str
    matched: int
    tokens: list[int]
    usable: int
    reason: str = ""


@dataclass(slots=True)
class Route:
    target: Slot | None  # None: wait (no idle slot, or deferred)
    source: str = "none"  # slot, fork, ram or none
    usable: int = 0  # prompt tokens the target is expected to keep
    plan: ReusePlan | None = None  # for source == "slot"
    donor: Slot | None = None  # for source == "fork"
    entry: CacheEntry | None = None  # for source == "ram"
    wait_for: Slot | None = None  # deferred until this slot's prefill passes the shared prefix
    best_candidate: Candidate | None = None


class Router:
    def __init__(
        self,
        slots: Sequence[Slot],
        cache: PromptCache | None,
        cutter: Callable[[Slot], Callable[[int], bool]],
        truncatable: bool,
    ) -> None:
        self.slots = slots
        self.cache = cache
        self.cutter = cutter
        self.truncatable = truncatable

    def route(self, req: GenerateRequest) -> Route:
        """Decide where `req` goes. Read-only: applying the route is the engine's job."""
        idle = [s for s in self.slots if s.active is None]
        if not req.reuse_prefix:
            return Route(self._receiver(idle, exclude=None)) if idle else Route(None)
        prompt = req.tokens
        best = Route(None)
        best_matched: Candidate | None = None

        def consider(route: Route, matched: int, tokens: list[int], reason: str = "") -> None:
            nonlocal best, best_matched
            if best_matched is None or (matched, route.usable) > (best_matched.matched, best_matched.usable):
                best_matched = Candidate(route.source, matched, tokens, route.usable, reason)
            if (route.usable, _RANK[route.source]) > (best.usable, _RANK.get(best.source, -1)):
                best = route

        for slot in self.slots:
            if slot.tenant != req.tenant or not slot.tokens:
                continue
            plan = plan_reuse(slot.tokens, slot.checkpoints, prompt, self.cutter(slot))
            if slot.active is None:
                consider(Route(slot, "slot", plan.keep, plan=plan), plan.matched, slot.tokens, plan.reason)
            if plan.keep > 0:
                consider(Route(None, "fork", plan.keep, donor=slot), plan.matched, slot.tokens, plan.reason)
        if self.cache is not None:
            cand = self.cache.best(prompt, req.tenant, self._entry_usable(prompt))
            if cand is not None:
                consider(Route(None, "ram", cand.usable, entry=cand.entry), cand.matched, list(cand.entry.tokens))
            elif best.usable == 0:
                self._note_cache_miss(req, consider)
        if self.cache is not None:
            evicted = self.cache.evicted_match(prompt, req.tenant)
            if evicted is not None and evicted[0] > max(best.usable, best_matched.matched if best_matched else 0):
                best_matched = Candidate("evicted", evicted[0], list(evicted[1]), 0,
                                         f"a prompt-cache entry sharing {evicted[0]} tokens was evicted (raise --cache-ram)")
        waiting = self._worth_waiting(req, best.usable)
        if waiting is not None:
            slot, shared = waiting
            return Route(None, usable=shared, wait_for=slot)
        if not idle:
            return Route(None)
        if best.source == "none" or best.usable == 0:
            best = Route(None)
        if best.source != "slot":
            best.target = self._receiver(idle, exclude=best.donor)
        best.best_candidate = best_matched
        return best

    def _note_cache_miss(self, req: GenerateRequest, consider) -> None:
        """No entry was usable; still name the one that shared the most, for the diagnosis."""
        cand = self.cache.best(req.tokens, req.tenant, lambda entry, matched: 1)
        if cand is not None:
            consider(Route(None, "ram", 0, entry=cand.entry), cand.matched, list(cand.entry.tokens),
                     "the prompt cache entry has no checkpoint at or before the divergence")

    def _entry_usable(self, prompt: list[int]) -> Callable[[CacheEntry, int], int]:
        def usable(entry: CacheEntry, matched: int) -> int:
            # after a load the memory ends at the entry's end; only attention memory can be
            # cut anywhere (an SWA window position is unknown until the load, so be strict)
            can_cut = (lambda n: True) if self.truncatable else (lambda n: False)
            return plan_reuse(entry.tokens, entry.checkpoints, prompt, can_cut).keep

        return usable

    def _worth_waiting(self, req: GenerateRequest, usable: int) -> tuple[Slot, int] | None:
        """A slot now prefilling a prompt that shares a long prefix with `req` beyond what
        is usable elsewhere: waiting for it beats computing the same tokens twice."""
        for slot in self.slots:
            active = slot.active
            if active is None or active.prefill_done or slot.tenant != req.tenant:
                continue
            shared = min(common_prefix(active.prompt, req.tokens), len(req.tokens) - 1)
            if shared >= usable + MIN_SHARED_TO_WAIT and slot.n_past < shared:
                return slot, shared
        return None

    @staticmethod
    def _receiver(idle: list[Slot], exclude: Slot | None) -> Slot:
        """An empty idle slot, else the least recently used one (not the donor, if possible)."""
        pool = [s for s in idle if s is not exclude] or idle
        return min(pool, key=lambda s: (len(s.tokens) > 0, s.last_used))
