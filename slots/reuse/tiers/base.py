"""The questions every tier answers: the device's idle streams, the RAM prompt cache, the disk.

A conversation lives in one of three tiers, each slower to bring back than the one before:
the device (a sequence that holds it), RAM (a prompt-cache entry), disk (a file). The router
asks them in that order, through `Tier`, the same questions:

- `match(req)`: how much of this prompt do you hold? A `TierMatch`: what the tier can give
  (routes without a target yet, `Offer`), and the candidates that explain a miss.
- `ready(offer)`: can you give it now, or must the request wait for a read (`Fetch`)?
- `take(offer)`: give me that state (what the slot loads or forks from).
- `put(entry)`: take this state (a conversation leaving the tier above).
- `give_up()`: what you would let go first, and what losing each costs in tokens.
- `counters()`: your sizes and counters, in one shape (`TierCounters`).

Like SGLang's `BasePrefixCache` for its device and host tiers, with typed results in place of
callbacks. The adapters (device.py, ram.py, disk.py) keep the tiers' own APIs; this module
names what they share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence, runtime_checkable

from warmslot.cache.disk import DiskEntry
from warmslot.cache.entries import CacheEntry

from ...requests import GenerateRequest, Source
from ..plan import plan_reuse
from .routes import Candidate, Offer


@dataclass(frozen=True, slots=True)
class Found:
    """One thing a tier looked at for a prompt: an offer the router may take (None: not
    usable), and the candidate that says how much it shared (for the miss explanation)."""

    offer: Offer | None
    candidate: Candidate


@dataclass(frozen=True, slots=True)
class TierMatch:
    """What a tier holds of a prompt, in the order the router weighs it (read-only)."""

    found: tuple[Found, ...] = ()

    @property
    def offers(self) -> list[Offer]:
        return [f.offer for f in self.found if f.offer is not None]

    @property
    def matched(self) -> int:
        """The most prompt tokens any candidate shares (usable or not)."""
        return max((f.candidate.matched for f in self.found), default=0)

    @property
    def usable(self) -> int:
        """The most prompt tokens an offer keeps (0: nothing usable)."""
        return max((o.usable for o in self.offers), default=0)


@dataclass(frozen=True, slots=True)
class Release:
    """Something a tier can give up: `item` (a slot, a RAM entry, a disk entry) holding
    `tokens`, `nbytes` of it (None: the device's pool does not say), and `cost`, the prompt
    tokens that would be computed again if it went (0: another copy serves them)."""

    item: object
    tokens: int
    nbytes: int | None
    cost: int


@dataclass(frozen=True, slots=True)
class TierCounters:
    """A tier's sizes and counters at one instant. `served_tokens`: prompt tokens this tier
    gave finished requests (the engine's count by source); `hits`: loads it served (None:
    the tier does not count them)."""

    source: Source
    entries: int
    nbytes: int | None
    hits: int | None
    evictions: int
    served_tokens: int


@runtime_checkable
class Tier(Protocol):
    """A tier of the memory hierarchy, as the router and admission see it (see the module)."""

    source: Source

    def match(self, req: GenerateRequest) -> TierMatch:
        """How much of `req`'s prompt the tier holds, for `req`'s tenant. Read-only."""
        ...

    def ready(self, offer: Offer) -> bool:
        """Whether `take(offer)` gives the state now, without waiting for a read."""
        ...

    def take(self, offer: Offer) -> object | None:
        """The state an offer names, to load or fork into the target (None: gone)."""
        ...

    def put(self, entry: CacheEntry) -> bool:
        """Keep a conversation leaving the tier above. Mutates; False: not kept."""
        ...

    def give_up(self) -> list[Release]:
        """What the tier would let go, first first, and its cost. Read-only."""
        ...

    def counters(self) -> TierCounters:
        """Sizes and a copy of the counters. Read-only."""
        ...


def entry_usable(prompt: Sequence[int], truncatable: bool) -> Callable[[CacheEntry | DiskEntry, int], int]:
    """How many of `prompt`'s tokens a slot keeps after loading an entry that shares
    `matched` of them. After a load the memory ends at the entry's end; only attention
    memory can be cut anywhere (an SWA window position is unknown until the load, so be
    strict)."""
    can_cut = (lambda n: True) if truncatable else (lambda n: False)

    def usable(entry: CacheEntry | DiskEntry, matched: int) -> int:
        return plan_reuse(entry.tokens, entry.checkpoints, prompt, can_cut).keep

    return usable
