"""Client sessions at work: the (tenant, session) pairs of requests that run now or finished a
moment ago. A session is an agent's whole run as its client names it (Claude Code sends its
session id with every request: `GenerateRequest.session`); between two of its requests the
agent runs a tool, and its conversations come back when it is done (see
warmslot.cache.lookahead.session_uses). Engine thread only."""

from __future__ import annotations

import time
from typing import Sequence

from ..slot import Slot

# seconds after a session's last request that it still counts as at work: an agent's tools
# run between its requests (a build or a test run may take longer)
ACTIVE_S = 60.0


class Sessions:
    def __init__(self) -> None:
        self._finished: dict[tuple[str, str], float] = {}  # (tenant, session) -> when its last request ended

    def finished(self, tenant: str, session: str) -> None:
        if session:
            self._finished[(tenant, session)] = time.monotonic()

    def active(self, slots: Sequence[Slot]) -> list[tuple[str, str]]:
        """The sessions with a request running in `slots` or ended within ACTIVE_S."""
        now = time.monotonic()
        for key in [k for k, t in self._finished.items() if now - t > ACTIVE_S]:
            del self._finished[key]
        running = [(s.tenant, s.active.req.session) for s in slots if s.active is not None and s.active.req.session]
        return running + list(self._finished)
