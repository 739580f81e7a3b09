"""N-gram drafts: drafts from a slot's own tokens.

Drafting (`NgramDrafter`, llama-server's `ngram-simple`): the last N tokens of the slot's
history (what its memory holds, then the sampled token not yet decoded) are looked up among
the earlier ones; the up to M tokens that followed their latest earlier occurrence are the
draft, cut to `--draft-max` (and dropped below `--draft-min`). Agents re-emit what their
context holds (a file written back with one change, a quoted tool output), and such a draft
then runs along the copy. Where the history holds no earlier occurrence, earlier requests'
outputs are searched (`ngram_memory.NgramMemory`, --spec-ngram-memory): a retried turn or a
call made again drafts from what was emitted the first time. A model that copies loosely (a
renamed variable, a changed number) breaks every N-gram around a change, so shorter n-grams
of the history are looked up next (`ngram_sizes`), their drafts cut where their two latest
occurrences were followed differently; and a copy whose tokens keep being emitted goes on
from its source (`NgramDrafter._go_on`).
"""

from __future__ import annotations

from typing import Sequence

from .ngram_memory import NgramMemory
from .spec_config import NGRAM_MIN


def ngram_sizes(n: int, n_min: int) -> tuple[int, ...]:
    """The n-gram lengths looked up, longest first: N, then about two thirds of the one
    before, down to n_min (12, 8, 6, 4, 3 by default)."""
    sizes = [n]
    while sizes[-1] > n_min:
        sizes.append(max(n_min, min(sizes[-1] - 1, (2 * sizes[-1] + 2) // 3)))
    return tuple(sizes)


class NgramDrafter:
    """ngram-simple over one request's history: for each n-gram length, an index of where
    each n-gram last started (and where it started the time before), grown as the history
    grows (the history of a running request only grows)."""

    def __init__(self, n: int, m: int, memory: NgramMemory | None = None, tenant: str = "", n_min: int | None = None) -> None:
        self.n = n
        self.m = m
        self.sizes = ngram_sizes(n, min(n, n_min if n_min is not None else NGRAM_MIN))
        self.memory = memory  # earlier requests' outputs, searched where the history has no match
        self.tenant = tenant
        self._last: dict[int, dict[int, int]] = {k: {} for k in self.sizes}  # hash of an n-gram -> its latest start
        self._before: dict[int, dict[int, int]] = {k: {} for k in self.sizes}  # -> the start before that
        self._indexed = {k: 0 for k in self.sizes}  # n-grams starting before this position are indexed
        # the copy the last draft came from: (the source's tokens, or None for the history;
        # where the draft's first token was in it; the history's length when drafted)
        self._copy: tuple[Sequence[int] | None, int, int] | None = None

    def draft(self, tokens: Sequence[int], pending: int, limit: int) -> list[int]:
        """Up to min(M, limit) tokens that followed an earlier occurrence of the end of
        tokens + [pending], [] when there is none:
        - the copy the last draft came from goes on, while what was emitted since equals it;
        - else the latest earlier occurrence of the last N tokens in the history, then in the
          newest remembered output that holds them;
        - else of a shorter n-gram of the history (about two thirds as long each time, down to
          --spec-ngram-size-min), cut where what followed its two latest occurrences differs: a
          short n-gram recurs in places it does not continue.
        A copy that reaches the present goes on as the repetition it is (an overlapping copy:
        in a history that repeats every P tokens the latest occurrence is P back, and the
        draft repeats that period), so a loop or a repeated line drafts its whole length."""
        history = len(tokens) + 1  # tokens, then the pending one
        k = min(self.m, limit)
        if history <= self.sizes[-1] or k <= 0:
            return []
        self._index(tokens)
        draft = self._go_on(tokens, pending, history, k)
        if draft is not None:
            return draft
        for size in self.sizes:
            key_start = history - size
            if key_start <= 0:
                continue
            key = list(tokens[key_start:])
            key.append(pending)
            h = hash(tuple(key))
            s = self._last[size].get(h)
            if s is not None and list(tokens[s : s + size]) == key:  # not a hash collision
                self._copy = (None, s + size, history)
                out = self._from_history(tokens, pending, s + size, k)
                before = self._before[size].get(h)
                if size < self.n and before is not None:
                    other = self._from_history(tokens, pending, before + size, len(out))
                    out = out[: next((i for i, (a, b) in enumerate(zip(out, other)) if a != b), len(out))]
                return out
            if size == self.n and self.memory is not None:
                found = self.memory.find(self.tenant, key)
                if found is not None:
                    source, start = found
                    self._copy = (source, start, history)
                    return list(source[start : start + k])
        self._copy = None
        return []

    def _index(self, tokens: Sequence[int]) -> None:
        for size in self.sizes:  # n-grams wholly inside `tokens`, before the last one
            last, before = self._last[size], self._before[size]
            for s in range(self._indexed[size], len(tokens) + 1 - size):
                h = hash(tuple(tokens[s : s + size]))
                old = last.get(h)
                if old is not None:
                    before[h] = old
                last[h] = s
            self._indexed[size] = max(self._indexed[size], len(tokens) + 1 - size)

    def _go_on(self, tokens: Sequence[int], pending: int, history: int, k: int) -> list[int] | None:
        """The last draft's copy, on from where it has got to, if every token emitted since
        it was drafted is the copy's (a whole draft accepted and the next token the source's
        next, or tokens emitted without verifying that follow it)."""
        if self._copy is None:
            return None
        source, start, then = self._copy
        done = history - then  # tokens emitted since
        if done <= 0:
            return None
        src = tokens if source is None else source
        at = start + done
        if at >= (history - 1 if source is None else len(src)) or src[at - 1] != pending:
            return None
        if any(tokens[then + i] != src[start + i] for i in range(done - 1)):
            return None
        self._copy = (source, at, history)
        if source is None:
            return self._from_history(tokens, pending, at, k)
        return list(src[at : at + k])

    @staticmethod
    def _from_history(tokens: Sequence[int], pending: int, start: int, k: int) -> list[int]:
        history = len(tokens) + 1
        out = list(tokens[start : start + k])
        if len(out) < k and start + len(out) == len(tokens):
            out.append(pending)
        while len(out) < k:
            out.append(out[start + len(out) - history])  # past the present: the copy repeats itself
        return out
