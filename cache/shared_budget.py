"""One byte budget for the caches of several models (their RAM prompt caches).

Each cache stays owned by its engine thread: no cache ever evicts another's entries. A
cache's budget is what the others leave free, and never less than its share (`total // n`
of the n caches that joined):

    budget(c) = max(total // n, total - sum of the others' bytes) - what c's model holds beside it

So one busy model may fill the whole budget while the others hold little, and a model that
comes back always has its share to grow into. When it grows into it, the caches now over
their budget are told (`on_over`, which the engine makes a call onto its own thread) and
give their oldest or least needed entries back there (`PromptCache.trim`). Until they have,
the caches together may hold more than `total`, by at most what the growing one took of its
share: the price of never reaching into another thread's cache.

Reads of the other caches' sizes are plain attribute reads of ints, taken without a lock:
a stale size makes one decision a little early or late, never inconsistent.
"""

from __future__ import annotations

import threading
from typing import Protocol


class Member(Protocol):
    nbytes: int  # what the cache holds
    reserved: int  # what its model holds beside it out of the same budget (spare streams in RAM)

    def budget_changed(self) -> None:
        """The budget may have shrunk below what the cache holds: trim on the owner's thread."""


class SharedBudget:
    def __init__(self, total: int) -> None:
        assert total > 0
        self.total = total
        self._members: list[Member] = []
        self._lock = threading.Lock()

    def join(self, member: Member) -> None:
        with self._lock:
            if not any(m is member for m in self._members):
                self._members = [*self._members, member]

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes + m.reserved for m in self._members)

    def share(self) -> int:
        return self.total // max(1, len(self._members))

    def budget_of(self, member: Member) -> int:
        others = sum(m.nbytes + m.reserved for m in self._members if m is not member)
        return max(0, max(self.share(), self.total - others) - member.reserved)

    def grew(self, member: Member) -> None:
        """`member` stored more: tell the others that are now over their budget."""
        for other in self._members:
            if other is not member and other.nbytes > self.budget_of(other):
                other.budget_changed()
