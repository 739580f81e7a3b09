"""The disk tier's index: which entries the directory holds, per tenant, in LRU order.

The same shape as the RAM cache: a token radix tree per tenant (`PrefixTrie`), so a lookup
is O(prompt length) and never a scan of the entries. Entries carry their checkpoints as an
outline (positions, and whether each holds state and logits) so that reuse can be planned
without reading a byte of state.

Least recently used order is a heap of (last use, id) with lazy deletion: an entry spilled
from RAM arrives with its own, older last use, so entries do not arrive in LRU order.
A segment (an entry holding only the state after the tokens it shares with another entry,
its `base`) keeps its base: a use touches the whole chain, so a base is never less recently
used than what continues it, and an entry that goes takes the entries chained to it along
(`DiskCache._drop`).

Entries that the directory holds but this server cannot use (another model, layout or
format version: `stale`) are in no tree; they count against the budget and are the first
to go when room is needed.

Not thread-safe: `DiskCache` guards it with its lock.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np

from .. import chains, segments
from ..checkpoints import Checkpoint, CheckpointList
from ..prefix_trie import Candidate, PrefixTrie, common_prefix, rank
from .records import CheckpointInfo, Header, Meta, Payload

# stands for bytes that exist in the file: an outline checkpoint only says what is there
_PRESENT = np.empty(0, dtype=np.uint8)
_PRESENT.flags.writeable = False


@dataclass(eq=False)
class DiskEntry:
    name: str  # the file's name in the directory
    tokens: tuple[int, ...]
    tenant: str
    fingerprint: str
    nbytes: int  # the exact size of the file
    state_bytes: int
    infos: tuple[CheckpointInfo, ...]
    prompt_end: int
    last_used: float  # wall-clock seconds
    keep_s: float | None  # retention: expires this long after its last use (None: LRU only)
    id: int = 0
    header: Header | None = None  # the head as written or indexed: a load checks the file still has it
    pending: Payload | None = None  # the bytes while they are being written (a load takes them from here)
    meta: Meta | None = None  # what its header says, as planned when it was queued (sizes depend on it)
    stale: str | None = None  # why this server cannot use it (another model or version); not in any tree
    alive: bool = True  # False once removed from the index
    linear: bool = False  # its state holds each token's position once: a segment may continue it
    base: "DiskEntry | None" = None  # a segment: the entry holding its first base_len tokens
    base_len: int = 0
    dependents: list["DiskEntry"] = field(default_factory=list, repr=False)  # the segments continuing it
    cut: "segments.Piece | None" = None  # a segment being written: its pending whole state's cells to keep
    _outline: CheckpointList | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def checkpoints(self) -> CheckpointList:
        """The checkpoints' outline: positions with markers for the state and logits the file
        holds (no bytes). Enough to plan reuse; a load reads the real ones. Cached."""
        if self._outline is None:
            outline = CheckpointList(max(1, len(self.infos)), 1 << 62)
            outline._items = [
                Checkpoint(c.n_tokens, _PRESENT if c.data_bytes is not None else None, _PRESENT if c.n_logits is not None else None)
                for c in self.infos
            ]
            self._outline = outline
        return self._outline

    def chain(self) -> list["DiskEntry"]:
        """The entry and the bases it needs, itself first."""
        out = [self]
        while out[-1].base is not None:
            out.append(out[-1].base)
        return out

    def needed(self, usable: int, n_prompt: int) -> frozenset[int]:
        """The positions of the checkpoints a load that keeps `usable` tokens of a prompt of
        `n_prompt` tokens uses: none when the prompt goes on past the whole entry (the
        usual next turn: the state alone), else the one at `usable` (the checkpoint a
        divergence restores, or the logits of an exact repeat), when there is one."""
        if usable == len(self.tokens) and usable < n_prompt:
            return frozenset()
        return frozenset(c.n_tokens for c in self.infos if c.n_tokens == usable)

    def bytes_for(self, checkpoints: frozenset[int] | None) -> int:
        """Bytes a load reads with these checkpoint positions (None: all: the whole file), and
        the states of the bases a segment continues."""
        bases = sum(e.state_bytes for e in self.chain()[1:])
        if checkpoints is None:
            return self.nbytes + bases
        skipped = sum((c.data_bytes or 0) + 4 * (c.n_logits or 0) for c in self.infos if c.n_tokens not in checkpoints)
        return self.nbytes - skipped + bases

    def expired(self, now: float) -> bool:
        return self.keep_s is not None and now > self.last_used + self.keep_s


DiskMatch = Candidate  # Candidate[DiskEntry]: a disk entry, the tokens shared and usable


def covers(truncatable: bool, longer: DiskEntry, point: int) -> bool:
    """Whether `longer` can serve a prompt that an entry of its first `point` tokens could."""
    if truncatable or point == len(longer):
        return True
    return any(c.n_tokens == point and c.data_bytes is not None for c in longer.infos)


class DiskIndex:
    def __init__(self) -> None:
        self._tries: dict[str, PrefixTrie[DiskEntry]] = {}
        self._by_name: dict[str, DiskEntry] = {}
        self._heap: list[tuple[float, int, DiskEntry]] = []
        self._stale: dict[str, DiskEntry] = {}
        self._ids = itertools.count(1)
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._by_name)

    @property
    def n_usable(self) -> int:
        return len(self._by_name) - len(self._stale)

    def get(self, name: str) -> DiskEntry | None:
        return self._by_name.get(name)

    def entries(self) -> Iterator[DiskEntry]:
        return iter(list(self._by_name.values()))

    # -- mutation ------------------------------------------------------------------------

    def add(self, entry: DiskEntry) -> None:
        """Index an entry. O(len(tokens) + log n). Mutates."""
        assert entry.name not in self._by_name, entry.name
        entry.id = next(self._ids)
        entry.alive = True
        self._by_name[entry.name] = entry
        if entry.base is not None:
            assert entry.base.alive and entry.base.linear, entry.base.name
            entry.base.dependents.append(entry)
            self.touch(entry.base, entry.last_used)
        if entry.stale is None:
            self._tries.setdefault(entry.tenant, PrefixTrie()).insert(entry.tokens, entry)
        else:
            self._stale[entry.name] = entry
        heapq.heappush(self._heap, (entry.last_used, entry.id, entry))
        self.nbytes += entry.nbytes

    def remove(self, entry: DiskEntry) -> None:
        """Take an entry out (its heap item is dropped lazily). O(len(tokens)). Mutates. The
        entries chained to it must be gone first."""
        if not entry.alive:
            return
        assert not entry.dependents, f"{entry.name} goes before the segments continuing it"
        if entry.base is not None:
            entry.base.dependents.remove(entry)
        entry.alive = False
        del self._by_name[entry.name]
        if entry.stale is None:
            trie = self._tries[entry.tenant]
            removed = trie.remove(entry.tokens, entry)
            assert removed
            if not len(trie):
                del self._tries[entry.tenant]
        else:
            del self._stale[entry.name]
        self.nbytes -= entry.nbytes
        if len(self._heap) > 64 and len(self._heap) > 4 * len(self._by_name):
            self._heap = [item for item in self._heap if item[2].alive and item[0] == item[2].last_used]
            heapq.heapify(self._heap)

    def touch(self, entry: DiskEntry, when: float) -> None:
        """Mark a use at wall-clock `when` (never moves back in time), of the bases it
        continues too. O(chain length x log n). Mutates."""
        node: DiskEntry | None = entry
        while node is not None and node.alive and when > node.last_used:
            node.last_used = when
            heapq.heappush(self._heap, (when, node.id, node))
            node = node.base

    def lru_victim(self) -> DiskEntry | None:
        """The entry to evict next: a stale one if any, else the least recently used.
        Amortized O(log n); drops outdated heap items. Does not remove the victim."""
        if self._stale:
            return min(self._stale.values(), key=lambda e: e.last_used)
        while self._heap:
            when, _, entry = self._heap[0]
            if entry.alive and when == entry.last_used:
                return entry
            heapq.heappop(self._heap)
        return None

    # -- lookup (read-only) --------------------------------------------------------------

    def lookup(
        self, query: Sequence[int], tenant: str, usable: Callable[[DiskEntry, int], int], now: float
    ) -> tuple[DiskMatch | None, DiskMatch | None, list[DiskEntry]]:
        """The entry of `tenant` that lets a slot keep the most of `query` (ties: the most
        recently used), the one sharing the most tokens (for explanations), and the expired
        entries seen on the way (for the caller to drop). O(len(query)) plus the entries on
        and below the match point. Read-only."""
        expired: list[DiskEntry] = []
        trie = self._tries.get(tenant)
        if trie is None:
            return None, None, expired

        def skip(entry: DiskEntry) -> bool:
            if entry.expired(now):
                expired.append(entry)
                return True
            return False

        best, closest = rank(trie.match(query), usable, skip)
        return best, closest, expired

    def exact(self, tokens: Sequence[int], tenant: str) -> DiskEntry | None:
        """An entry holding exactly `tokens` for `tenant`. O(len(tokens)). Read-only."""
        trie = self._tries.get(tenant)
        if trie is None:
            return None
        for n, entry in trie.match(tokens).prefixes:
            if n == len(tokens) and len(entry) == n:
                return entry
        return None

    def base_for(self, tokens: tuple[int, ...], tenant: str, fingerprint: str) -> tuple[DiskEntry | None, int]:
        """The entry a segment of `tokens` would continue, and the tokens they share (as the
        RAM cache picks: chains.base_for). O(len(tokens)) plus the entries below the match
        point. Read-only."""
        trie = self._tries.get(tenant)
        if trie is None:
            return None, 0
        return chains.base_for(trie.match(tokens), tokens, fingerprint)

    def covered_by(self, entry: DiskEntry, truncatable: bool) -> list[DiskEntry]:
        """Older entries of the same tenant that `entry` serves up to the end of their last
        prompt (a strict prefix of it, or the previous turn of its conversation), but for
        those that segments continue (`entry` among them). Scans the tenant's entries,
        comparing tokens only where the last prompt token matches. Read-only."""
        trie = self._tries.get(entry.tenant)
        if trie is None:
            return []
        out = []
        new = entry.tokens
        for old in trie.values():
            end = old.prompt_end
            if old is entry or old.dependents or end > len(new) or (end > 0 and old.tokens[end - 1] != new[end - 1]):
                continue
            shared = common_prefix(old.tokens, entry.tokens)
            point = min(old.prompt_end, shared)
            if shared >= old.prompt_end and covers(truncatable, entry, point):
                out.append(old)
        return out

    def sanity_check(self) -> None:
        total = 0
        in_tries = 0
        for trie in self._tries.values():
            trie.sanity_check()
            in_tries += len(trie)
            for e in trie.values():
                assert e.alive and e.stale is None and self._by_name.get(e.name) is e
        for e in self._by_name.values():
            total += e.nbytes
            if e.base is not None:
                assert e.base.alive and self._by_name.get(e.base.name) is e.base and e in e.base.dependents
                assert 0 < e.base_len < len(e) and e.base_len <= len(e.base) and e.tokens[:e.base_len] == e.base.tokens[:e.base_len]
                assert e.base.last_used >= e.last_used, "a base is used no less recently than its segments"
            assert all(d.alive and d.base is e for d in e.dependents)
        assert in_tries == self.n_usable == sum(1 for e in self._by_name.values() if e.stale is None)
        assert all(self._by_name.get(name) is e and e.stale is not None for name, e in self._stale.items())
        assert total == self.nbytes, (total, self.nbytes)
        live = {id(item[2]) for item in self._heap if item[2].alive and item[0] == item[2].last_used}
        assert live == {id(e) for e in self._by_name.values()}, "every entry has its heap item"
