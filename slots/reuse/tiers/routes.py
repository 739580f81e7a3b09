"""The routes the router returns, and the candidate it explains a miss with.

A tier offers a route with no target yet (`KeepSlot`, `Fork`, `Load`, `FromDisk`: see
base.py); the router picks the best offer and names the slot it goes into. Each route
carries exactly what applying it needs (slots/reuse/prefix.py applies it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

from warmslot.cache.disk import DiskEntry
from warmslot.cache.entries import CacheEntry

from ...requests import Source
from ..plan import ReusePlan
from ...slot import Slot


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
        return self.plan.kept  # its exact prefix and any chunks shifted after it (--cache-reuse)


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


Offer = Union[KeepSlot, Fork, Load, FromDisk]  # what a tier can give, before a target is named


def score(route) -> float:
    """A route's usable prefix, less what reading it costs (disk), in tokens."""
    return route.usable - getattr(route, "cost", 0.0)
