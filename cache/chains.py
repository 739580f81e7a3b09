"""Chains of prompt-cache entries (see segments.py): an entry stored as a segment holds the
state of its own tokens, and its base (and the base's base...) the state before them.

Pure functions over entries; `PromptCache` keeps the entries and counts the links."""

from __future__ import annotations

import itertools
from typing import Callable, Iterable, Mapping, Protocol, Sequence

import numpy as np

from . import segments
from .prefix_trie import Match


class CacheEntry(Protocol):
    """What a chain needs of a prompt-cache entry (entries.CacheEntry)."""

    id: int
    tokens: tuple[int, ...]
    base: "CacheEntry | None"
    base_len: int
    layout: segments.Layout | None
    linear: bool
    fingerprint: str
    last_used: float

    def __len__(self) -> int: ...

SEGMENT_MIN_TOKENS = 64  # a shorter shared prefix is not worth a chain link


def chain(entry: CacheEntry) -> list[CacheEntry]:
    """The entry and the bases it needs, itself first."""
    out = [entry]
    while out[-1].base is not None:
        out.append(out[-1].base)
    return out


def join(entry: CacheEntry, empty: Callable[[int], np.ndarray], start: int = 0) -> np.ndarray:
    """The chained entry's whole state (with `start`: its cells from that position on),
    joined into `empty(n)`: each link gives its cells below the point where the one after it
    starts."""
    links = []
    for node in chain(entry):
        assert node.layout is not None, "a chain link keeps its parsed state"
        links.append((node.layout, node.base_len))
    return join_links(links, len(entry), empty, start)


def join_links(links: Sequence[tuple[segments.Layout, int]], n_tokens: int, empty: Callable[[int], np.ndarray],
               start: int = 0) -> np.ndarray:
    """The whole state of `n_tokens` tokens from a chain's parsed states, its tip first: each
    link `(layout, begin)` holds the cells from position `begin` on (0: a whole state, which
    ends the chain) and gives those below the point where the one after it starts. The parts
    that come whole (a window, a recurrent state) come from the tip. With `start`, only the
    cells at `start` and after: the state of a tail, for a sequence that holds the rest."""
    pieces = []
    end = n_tokens
    for i, (layout, begin) in enumerate(links):
        if i == 0 and start == 0:
            cells = np.arange(layout.n)
        else:
            cells = np.flatnonzero((layout.pos >= max(begin, start)) & (layout.pos < end))
        pieces.append((layout, cells))
        end = min(end, begin)
        if end <= start:
            break
    if end > start:
        raise ValueError(f"the chain holds no cells below position {end}")
    return segments.join(pieces[::-1], empty)


def cuttable(layout: segments.Layout, shared: int) -> bool:
    """Whether the state may be stored as a segment from position `shared` on: its parts that
    come whole from the tip (a sliding window) lie in its own tokens."""
    return not any(part.n and part.pos.min() < shared for part in layout.rest)


def base_for(match: Match[CacheEntry], tokens: Sequence[int], fingerprint: str) -> tuple[CacheEntry | None, int]:
    """The entry a new one of `tokens` chains to, from the walk of its tenant's tree, and the
    tokens they share: the longest prefix held (ties: the most recently used), at least
    SEGMENT_MIN_TOKENS long, and of the entries holding it, the one nearest the chain's
    root (so an entry depends on no link that holds none of what it shares)."""
    best, shared = None, 0
    for matched, entry in itertools.chain(match.prefixes, ((match.depth, e) for e in match.extensions())):
        matched = min(matched, len(entry), len(tokens) - 1)
        if matched < SEGMENT_MIN_TOKENS or not entry.linear or entry.fingerprint != fingerprint:
            continue
        if best is None or (matched, entry.last_used) > (shared, best.last_used):
            best, shared = entry, matched
    while best is not None and best.base is not None and best.base_len >= shared:
        best = best.base
    return best, shared


def bases_after_dependents(order: Iterable[int], children: Mapping[int, int], entries: Mapping[int, CacheEntry],
                           freed: Iterable[CacheEntry] = ()) -> list[int]:
    """`order` (keys of entries to give up; -1 for a new entry) with every base moved to
    right after the last entry chained to it; a base whose dependents do not all go stays
    out. `children` counts the entries chained to each key; `freed` are already leaving."""
    left = dict(children)
    for e in freed:
        if e.base is not None:
            left[e.base.id] -= 1
    out: list[int] = []
    held: set[int] = set()
    for key in order:
        if key != -1 and left.get(key, 0) > 0:
            held.add(key)
            continue
        out.append(key)
        node = entries[key] if key != -1 else None
        while node is not None and node.base is not None:
            parent = node.base.id
            left[parent] -= 1
            if left[parent] or parent not in held:
                break
            held.discard(parent)
            out.append(parent)
            node = entries[parent]
    return out
