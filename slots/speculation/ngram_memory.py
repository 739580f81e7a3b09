"""What earlier requests emitted, as n-gram drafts for later ones.

A request drafts from its own history first (`speculative.NgramDrafter`). What it is about to
emit is often not in its history but in another request's output: an agent's retry of a
turn, the same tool call made again with other arguments, a file regenerated after an
edit was refused, parallel agents on similar tasks. So each finished request's output, with
the last tokens of its prompt before it (the n-gram that ends at its first token), is kept
here, up to a budget of tokens; when the request's own history has no earlier occurrence of
its last n-gram, the newest remembered output that has one drafts the tokens that followed
it there.

Outputs are kept by tenant and are only drafted from for requests of the same tenant: a
draft is verified and never changes what a request emits, but how fast it runs would tell
one tenant what another's outputs held. Engine thread only.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Sequence

MEMORY_TOKENS = 1 << 16  # --spec-ngram-memory: tokens of earlier outputs kept (0: none)
MAX_ENTRY = 1 << 14  # an output's last tokens kept, at most


@dataclass(slots=True, eq=False)
class _Entry:
    tenant: str
    tokens: list[int]


class NgramMemory:
    """Outputs kept in the order they ended, the oldest dropped first past the budget, and
    one index over all of them: (tenant, hash of an n-gram) -> its newest start. Dropping
    the oldest entry never hides a newer occurrence, so the index only loses what it held
    of the dropped entry."""

    def __init__(self, n: int, budget: int = MEMORY_TOKENS) -> None:
        self.n = n
        self.budget = budget
        self._entries: collections.deque[_Entry] = collections.deque()
        self._index: dict[tuple[str, int], tuple[_Entry, int]] = {}
        self._tokens = 0

    def __len__(self) -> int:
        return self._tokens

    def _keys(self, entry: _Entry):
        n, tokens = self.n, entry.tokens
        for s in range(len(tokens) - n):  # n-grams that something follows
            yield (entry.tenant, hash(tuple(tokens[s : s + n]))), s

    def remember(self, tenant: str, prompt: Sequence[int], generated: Sequence[int]) -> None:
        """Keep an output, after the last n - 1 tokens of its prompt (so that the n-gram
        that ends at its first token is found)."""
        n = self.n
        if self.budget <= 0 or len(generated) < 2:
            return
        tokens = list(prompt[max(0, len(prompt) - n + 1):]) + list(generated[-MAX_ENTRY:])
        entry = _Entry(tenant, tokens[-min(self.budget, MAX_ENTRY + n):])
        for key, s in self._keys(entry):
            self._index[key] = (entry, s)
        self._entries.append(entry)
        self._tokens += len(entry.tokens)
        while self._tokens > self.budget:
            old = self._entries.popleft()
            self._tokens -= len(old.tokens)
            for key, _ in self._keys(old):
                if self._index.get(key, (None,))[0] is old:
                    del self._index[key]

    def find(self, tenant: str, key: Sequence[int]) -> tuple[list[int], int] | None:
        """(the tokens of the newest remembered output of `tenant` that holds the n-gram
        `key`, where what followed it there starts); None when none does."""
        if len(key) != self.n:
            return None
        found = self._index.get((tenant, hash(tuple(key))))
        if found is None:
            return None
        entry, s = found
        if entry.tokens[s : s + self.n] != list(key):  # a hash collision
            return None
        return entry.tokens, s + self.n

    def draft(self, tenant: str, key: Sequence[int], k: int) -> list[int]:
        """Up to k tokens that followed the n-gram `key` in the newest remembered output of
        `tenant` that holds it; [] when none does."""
        found = self.find(tenant, key) if k > 0 else None
        if found is None:
            return []
        tokens, start = found
        return tokens[start : start + k]
