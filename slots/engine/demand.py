"""What the engine knows about demand (`warmslot.cache.demand.Demand`), implemented once and
given to the router, the prefixes and the prompt cache when they are built: the requests
waiting in `Admission`'s queue, the client sessions at work (the outbox's `Sessions`), and
what the slots of the loaded model hold."""

from __future__ import annotations

import concurrent.futures
from typing import Any, Callable, Iterable, Sequence

from .admission import Admission
from ..requests import GenerateRequest
from ..reuse.sessions import Sessions
from ..slot import Slot

__all__ = ["EngineDemand"]


class EngineDemand:
    def __init__(
        self,
        admission: Admission,
        sessions: Sessions,
        slots: Callable[[], Sequence[Slot]],
        call: Callable[[Callable[[Any], Any]], concurrent.futures.Future],
    ) -> None:
        """`slots()`: the loaded model's slots (none while it sleeps); `call(fn)`: runs
        fn(engine) on the engine thread between steps."""
        self._admission = admission
        self._sessions = sessions
        self._slots = slots
        self._call = call

    def waiting(self) -> Sequence[GenerateRequest]:
        return self._admission.waiting

    def upcoming(self) -> Iterable[tuple[str, Sequence[int]]]:
        return ((r.scope, r.tokens) for r in self._admission.waiting)

    def sessions(self) -> Iterable[tuple[str, str]]:
        return self._sessions.active(self._slots())

    def waiting_sessions(self) -> Iterable[tuple[str, str]]:
        return ((r.scope, r.session) for r in self._admission.waiting)

    def on_device(self) -> Iterable[tuple[str, Sequence[int]]]:
        return ((s.tenant, s.tokens) for s in self._slots() if s.tokens)

    def later(self, fn: Callable[[], None]) -> None:
        self._call(lambda engine: fn())
