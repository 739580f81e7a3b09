"""The RAM tier: the prompt cache (cache/prompt_cache.py) as the router asks it.

A hit is a `Load` of an entry into a slot; the entry stays (the cache is never consumed).
A miss is explained by the entry that shared the most but has no checkpoint at or before
the divergence, or by a recently evicted entry that would have served.
"""

from __future__ import annotations

from warmslot.cache import segments
from warmslot.cache.entries import CacheEntry
from warmslot.cache.prompt_cache import PromptCache

from ...requests import GenerateRequest, Source
from ...stats import EngineStats
from .base import Found, Release, TierCounters, TierMatch, entry_usable
from .routes import Candidate, Load, Offer


class RamTier:
    source = Source.RAM

    def __init__(self, cache: PromptCache, truncatable: bool, stats: EngineStats | None = None) -> None:
        self.cache = cache
        self.truncatable = truncatable  # whether a loaded entry can be cut back anywhere
        self.stats = stats

    def match(self, req: GenerateRequest) -> TierMatch:
        """The cache's best entry, or the entry that shared the most (unusable, for the
        explanation), and a recently evicted entry that would have served. Read-only."""
        lookup = self.cache.lookup(req.tokens, req.scope, entry_usable(req.tokens, self.truncatable))
        found = []
        if lookup.best is not None:
            e = lookup.best
            found.append(Found(Load(None, e.entry, e.usable), Candidate(Source.RAM, e.matched, e.entry.tokens, e.usable, "", e.entry.prompt_end)))
        elif lookup.closest is not None:
            e = lookup.closest
            found.append(Found(None, Candidate(Source.RAM, e.matched, e.entry.tokens, 0,
                                               "the prompt cache entry has no checkpoint at or before the divergence", e.entry.prompt_end)))
        if lookup.evicted is not None:
            matched, tokens = lookup.evicted
            found.append(Found(None, Candidate(Source.EVICTED, matched, tokens, 0,
                                               f"a prompt-cache entry sharing {matched} tokens was evicted (raise --cache-ram)")))
        return TierMatch(tuple(found))

    def ready(self, offer: Offer) -> bool:
        """Always: the entry is in RAM."""
        return True

    def take(self, offer: Load) -> CacheEntry:
        """The entry to load. Read-only: `Prefixes` marks it used and keeps it out of
        eviction while it loads."""
        return offer.entry

    def put(self, entry: CacheEntry) -> bool:
        """Store a copy of a conversation (a chained one whole). Evicts for room (see
        `PromptCache.insert`). Mutates."""
        state = self.cache.whole_state(entry, segments.ordinary) if entry.base is not None else entry.state
        return self.cache.insert(list(entry.tokens), state, entry.checkpoints, entry.tenant, entry.prompt_end,
                                 entry.keep_s, draft=entry.draft, session=entry.session) is not None

    def give_up(self) -> list[Release]:
        """The entries in eviction's order; one whose tokens a device sequence starts with
        costs nothing to lose. Read-only."""
        held = self.cache.held_on_device()
        return [Release(e, len(e), e.nbytes, 0 if e.id in held else len(e)) for e in self.cache.give_up_order()]

    def counters(self) -> TierCounters:
        """Entries, bytes, loads served, evictions, and the prompt tokens RAM gave. Read-only."""
        c = self.cache
        served = self.stats.prompt_tokens["ram"] if self.stats is not None else 0
        return TierCounters(self.source, c.n_entries, c.nbytes, c.stats.hits, c.stats.evictions, served)
