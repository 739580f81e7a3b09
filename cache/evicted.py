"""The keys of recently evicted prompt-cache entries, kept so that a miss can be explained
("a prompt-cache entry sharing N tokens was evicted"): a token tree per tenant, the oldest
forgotten first."""

from __future__ import annotations

from collections import deque
from typing import Sequence

from .prefix_trie import PrefixTrie

REMEMBERED = 256  # evicted keys kept


class EvictedKeys:
    def __init__(self) -> None:
        self._tries: dict[str, PrefixTrie[tuple[int, ...]]] = {}
        self._order: deque[tuple[str, tuple[int, ...]]] = deque()

    def add(self, tenant: str, tokens: tuple[int, ...]) -> None:
        self._tries.setdefault(tenant, PrefixTrie()).insert(tokens, tokens)
        self._order.append((tenant, tokens))
        while len(self._order) > REMEMBERED:
            tenant, tokens = self._order.popleft()
            trie = self._tries[tenant]
            for _, value in trie.match(tokens).prefixes:
                if value is tokens:
                    trie.remove(tokens, value)
                    break
            if not len(trie):
                del self._tries[tenant]

    def match(self, query: Sequence[int], tenant: str) -> tuple[int, tuple[int, ...]] | None:
        """The longest prefix `query` shares with a remembered key of `tenant`, and that key.
        Read-only."""
        trie = self._tries.get(tenant)
        if trie is None:
            return None
        match = trie.match(query)
        found = [v for _, v in match.prefixes] + list(match.extensions())
        return (match.depth, found[0]) if found and match.depth > 0 else None
