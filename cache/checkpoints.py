"""Checkpoints: saved partial sequence state at chosen token positions.

A sequence whose memory cannot be cut back to an arbitrary position (sliding-window
attention, recurrent or hybrid models) can still go back to a position where a checkpoint
was taken: restore the checkpoint's partial state, then cut the attention part back to it.

A checkpoint at `n_tokens` holds the state after the first `n_tokens` tokens. One taken at
the end of a prompt also keeps the logits of the prompt's last token, so an exact repeat of
that prompt needs no token evaluated at all. On attention-only memory a checkpoint holds no
state (`data` is None): only those logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np


@dataclass(frozen=True, slots=True)
class Checkpoint:
    n_tokens: int
    data: np.ndarray | None  # partial state (read-only once made); None on attention memory
    logits: np.ndarray | None = None  # logits after token n_tokens-1, when taken at a prompt end

    def __post_init__(self) -> None:
        assert self.n_tokens > 0, "a checkpoint covers at least one token"
        assert self.data is not None or self.logits is not None, "a checkpoint must hold something"

    @property
    def nbytes(self) -> int:
        n = 0 if self.data is None else int(self.data.nbytes)
        return n + (0 if self.logits is None else int(self.logits.nbytes))


class CheckpointList:
    """A slot's checkpoints, sorted by position, bounded in count and bytes.

    Checkpoints are immutable, so copying a list shares their buffers: copies are cheap and
    a restore never changes the source.
    """

    def __init__(self, max_count: int, max_bytes: int) -> None:
        assert max_count >= 1
        self.max_count = max_count
        self.max_bytes = max_bytes
        self._items: list[Checkpoint] = []
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Checkpoint]:
        return iter(self._items)

    def copy(self) -> "CheckpointList":
        """A new list holding the same (shared, immutable) checkpoints. Does not mutate self."""
        other = CheckpointList(self.max_count, self.max_bytes)
        other._items = list(self._items)
        other.nbytes = self.nbytes
        return other

    def positions(self) -> list[int]:
        return [c.n_tokens for c in self._items]

    def at(self, n_tokens: int) -> Checkpoint | None:
        for c in self._items:
            if c.n_tokens == n_tokens:
                return c
        return None

    def newest_at_or_before(self, n: int, *, with_state: bool) -> Checkpoint | None:
        """The checkpoint with the largest position <= n (holding state if asked). Read-only."""
        best = None
        for c in self._items:
            if c.n_tokens > n:
                break
            if not with_state or c.data is not None:
                best = c
        return best

    def add(self, ckpt: Checkpoint) -> int:
        """Insert (replacing one at the same position) and enforce the bounds.

        Mutates. Returns the number of checkpoints evicted to stay within the bounds.
        """
        self._remove_where(lambda c: c.n_tokens == ckpt.n_tokens)
        self._items.append(ckpt)
        self._items.sort(key=lambda c: c.n_tokens)
        self.nbytes += ckpt.nbytes
        evicted = 0
        while len(self._items) > 1 and (len(self._items) > self.max_count or self.nbytes > self.max_bytes):
            victim = self._eviction_victim(protect=ckpt)
            self._items.remove(victim)
            self.nbytes -= victim.nbytes
            evicted += 1
        return evicted

    def drop_after(self, n: int) -> int:
        """Remove checkpoints beyond position n (their state is no longer on the path). Mutates."""
        return self._remove_where(lambda c: c.n_tokens > n)

    def clear(self) -> None:
        self._items.clear()
        self.nbytes = 0

    def _remove_where(self, pred) -> int:
        keep = [c for c in self._items if not pred(c)]
        removed = len(self._items) - len(keep)
        if removed:
            self._items = keep
            self.nbytes = sum(c.nbytes for c in keep)
        return removed

    def _eviction_victim(self, protect: Checkpoint) -> Checkpoint:
        """Which checkpoint to drop: keep the first (shared system prefix) and the newest two
        (where the next turn diverges); among the rest, drop the one closest to its
        predecessor, which keeps the survivors spread out."""
        items = self._items
        candidates = [c for c in items[1:-2] if c is not protect]
        if not candidates:
            candidates = [c for c in items if c is not protect] or items
            return min(candidates, key=lambda c: c.n_tokens)
        index = {id(c): i for i, c in enumerate(items)}
        return min(candidates, key=lambda c: c.n_tokens - items[index[id(c)] - 1].n_tokens)
