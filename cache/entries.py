"""The records of the RAM prompt cache (prompt_cache.py): an entry (`CacheEntry`), the
drafter's memory of the same conversation (`DraftState`), the cache's counters
(`CacheStats`) and what a lookup finds (`Lookup`). The disk tier stores entries of the same
shape (`cache/disk/`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import segments
from .checkpoints import CheckpointList
from .prefix_trie import Candidate


@dataclass(frozen=True, eq=False)
class DraftState:
    """What a drafter's own memory holds of a conversation: the tokens its sequence holds (a
    prefix of the entry's, and perhaps tokens of a draft past it), that sequence's state, and
    what else the drafter needs to go on (read-only arrays)."""

    tokens: tuple[int, ...]
    state: np.ndarray
    extra: tuple[np.ndarray, ...] = ()
    fingerprint: str = ""  # the drafter and its state layout: loaded only by an equal one

    @property
    def arrays(self) -> tuple[np.ndarray, ...]:
        """Its state and extra arrays, in that order (as the disk format stores them)."""
        return (self.state, *self.extra)

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.arrays)


@dataclass(eq=False)
class CacheEntry:
    tokens: tuple[int, ...]
    state: np.ndarray  # the full sequence state (read-only)
    checkpoints: CheckpointList
    tenant: str
    fingerprint: str
    last_used: float = 0.0
    id: int = 0
    prompt_end: int = 0  # length of the last prompt in it; what follows is a generated reply
    keep_s: float | None = None  # retention on disk: 0 never written there, None no limit but LRU
    session: str = ""  # the client session of the request that made it (eviction: lookahead.session_uses)
    draft: DraftState | None = None  # the drafter's memory of it (speculative decoding)
    # a segment: `state` holds tokens [base_len, len) only, and `base` the state before them
    base: "CacheEntry | None" = None
    base_len: int = 0
    linear: bool = False  # its state holds each token's position once, so it may be a base
    layout: segments.Layout | None = None  # its state parsed (segments on)

    @property
    def chained(self) -> bool:
        return self.base is not None

    @property
    def nbytes(self) -> int:
        return int(self.state.nbytes) + self.checkpoints.nbytes + (self.draft.nbytes if self.draft is not None else 0)

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    refused: int = 0  # entries not stored: every waiting request needs what the cache holds sooner
    dropped_redundant: int = 0
    saved_bytes: int = 0
    loaded_bytes: int = 0
    save_seconds: float = 0.0
    load_seconds: float = 0.0
    chained: int = 0  # entries stored as segments of another entry
    chain_bytes_spared: int = 0  # bytes those entries did not store (their bases hold them)
    join_seconds: float = 0.0  # joining chains into whole states for loads and the disk tier


EntryMatch = Candidate  # Candidate[CacheEntry]: a RAM entry, the tokens shared and usable


@dataclass(frozen=True, slots=True)
class Lookup:
    """What the cache knows about a query, from one walk of the tenant's tree."""

    best: EntryMatch | None  # the entry that lets a slot keep the most of the query
    closest: EntryMatch | None  # when no entry is usable: the one sharing the most tokens
    evicted: tuple[int, tuple[int, ...]] | None  # (shared tokens, key) of an evicted entry
